"""Every notebook is stored without outputs and runs top to bottom on CPU.

Each is executed with nbclient in a fresh python3 kernel, from notebooks/
(as a reader opening it in Jupyter would), with a per-cell time limit; the
training notebook reads MNIST from a temporary copy of the original .gz files.
"""
import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MNIST_RAW = Path(os.environ.get("COLLECTIVES_MNIST_RAW", "/work/shared/data/MNIST/raw"))


def test_at_least_five_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} is stored with outputs; clear them before committing")


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    if not MNIST_RAW.is_dir():
        return None
    root = tmp_path_factory.mktemp("data")
    (root / "MNIST" / "raw").mkdir(parents=True)
    for f in MNIST_RAW.glob("*.gz"):
        shutil.copy(f, root / "MNIST" / "raw" / f.name)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, mnist_dir, monkeypatch, tmp_path):
    if "mnist" in path.name:
        if mnist_dir is None:
            pytest.skip(f"no MNIST .gz files in {MNIST_RAW}")
        monkeypatch.setenv("COLLECTIVES_DATA", str(mnist_dir))
    monkeypatch.setenv("COLLECTIVES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "60")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
