"""Every notebook is a lesson stored with its outputs, and still runs top to bottom on CPU.

The committed notebooks carry their outputs (figures, tables, the grader's
verdicts) so that GitHub and nbviewer show them; ``python notebooks/execute.py``
writes them. The tests check the stored form (valid nbformat 4, at least 15
cells and 2 figures, an exercise graded, no error) and execute each from
scratch with nbclient in a fresh python3 kernel, from notebooks/ (as a reader
opening it in Jupyter would); the training notebook reads MNIST from a
temporary copy of the original .gz files.
"""
import base64
import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MNIST_RAW = Path(os.environ.get("COLLECTIVES_MNIST_RAW", "/work/shared/data/MNIST/raw"))
MIN_CELLS, MIN_FIGURES = 15, 2


def images(nb):
    return [o["data"]["image/png"] for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if "image/png" in o.get("data", {})]


def errors(nb):
    return [f"{o.ename}: {o.evalue}" for c in nb.cells if c.cell_type == "code"
            for o in c.outputs if o.output_type == "error"]


def test_at_least_five_notebooks():
    assert len(NOTEBOOKS) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_as_an_executed_lesson(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)                      # what jupyter lab needs to open it
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(nb.cells) >= MIN_CELLS, f"{path.name}: {len(nb.cells)} cells, want >= {MIN_CELLS}"
    assert any(c.cell_type == "markdown" for c in nb.cells)
    assert all(c.execution_count is not None for c in code), (
        f"{path.name} is stored unexecuted; run python notebooks/execute.py {path.name}")
    assert not errors(nb), f"{path.name} is stored with errors: {errors(nb)}"
    pngs = images(nb)
    assert len(pngs) >= MIN_FIGURES, f"{path.name}: {len(pngs)} figures stored, want >= {MIN_FIGURES}"
    for png in pngs:
        assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(png) < 300_000, f"{path.name}: a figure of {len(png)} base64 bytes; lower its dpi"
    assert path.stat().st_size < 1_000_000, f"{path.name} is {path.stat().st_size} bytes"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_has_a_graded_exercise(path):
    nb = nbformat.read(path, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "NOT WRITTEN" in text, f"{path.name}: no grader verdict on the empty exercise"
    assert "PASS" in text, f"{path.name}: no passing grader verdict on the reference solution"


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
    for cell in nb.cells:                      # from scratch: the stored outputs are dropped
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    assert not errors(nb)
    assert len(images(nb)) >= MIN_FIGURES, f"{path.name} drew {len(images(nb))} figures"
