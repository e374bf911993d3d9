"""Execute the notebooks and store them with their outputs (so GitHub and nbviewer show them).

    python notebooks/execute.py                      # every notebook
    python notebooks/execute.py notebooks/2_*.ipynb  # some

Each runs top to bottom in a fresh python3 kernel from notebooks/, as a reader's
Jupyter would. Volatile metadata (execution timestamps, kernel versions) is
dropped so that a re-run changes only what really changed. The MNIST notebook
reads ``COLLECTIVES_DATA`` (a directory holding MNIST/raw/*.gz).
"""
import sys
import time
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent


def strip_volatile(nb):
    """Keep outputs; drop what changes on every run without meaning anything."""
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("collapsed", None) if cell.cell_type != "code" else None
    return nb


def execute(path, timeout=240):
    """Run ``path`` in a fresh kernel; return the executed notebook (not yet written)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(Path(path).parent)}}).execute()
    return strip_volatile(nb)


def main(paths):
    for path in paths or sorted(HERE.glob("*.ipynb")):
        start = time.monotonic()
        nb = execute(path)
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"{Path(path).name}: executed in {time.monotonic() - start:.0f} s, "
              f"{Path(path).stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(sys.argv[1:])
