"""Every notebook executes top to bottom and ends with a computed conclusion.

The notebooks run one after another in one Jupyter kernel (started in the notebooks' folder, as
Jupyter starts it), each from an emptied namespace (`%reset -f`), so that a notebook that uses a
name it never defines fails as it would in a fresh kernel; a kernel per notebook cost about 2 s of
start-up and imports each. The module-scoped kernel keeps these tests on one xdist worker
(tests/conftest.py).
"""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
RESOURCES = {"metadata": {"path": str(FOLDER)}}  # the kernel's working directory


@pytest.fixture(scope="module")
def kernel():
    """A started python3 kernel (its manager), shut down after the module's last notebook."""
    starter = NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3", resources=RESOURCES)
    with starter.setup_kernel():
        yield starter.km


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel):
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell("%reset -f"))  # nothing left from the notebook before
    client = NotebookClient(nb, km=kernel, timeout=120, kernel_name="python3", resources=RESOURCES)
    try:
        client.execute()
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
    last = nb.cells[-1]
    assert last.cell_type == "code"
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    assert text.strip(), "the conclusion cell printed nothing"
