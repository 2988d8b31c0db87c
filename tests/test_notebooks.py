"""Every notebook executes top to bottom and ends with a computed conclusion.

The notebooks run one after another in one Jupyter kernel (started in the notebooks' folder, as
Jupyter starts it), each from an emptied namespace (`%reset -f`), so that a notebook that uses a
name it never defines fails as it would in a fresh kernel; a kernel per notebook cost about 2 s of
start-up and imports each. The module-scoped kernel keeps these tests on one xdist worker
(tests/conftest.py).

A notebook whose runs take seconds keeps its run sizes in a cell tagged `parameters` (papermill's
convention); here a cell after it sets the smaller sizes of `SMOKE_SIZES`, so that every cell, every
kvsim call and every assertion of the notebook still runs (a cell that raises, a renamed API or
column, a conclusion that no longer computes fails here as at full size) in about a third of the
time. The sizes are chosen so that the conclusions take the branches the full-size notebooks take
where those are the ones the notebook is about: a configuration meets the SLO (colocated/disaggregated),
the plan's replica count is checked one fewer (fleet sizing), speculation stops paying within the
batch sizes and under the load (speculative crossover), the knee lies inside the sweep (saturation knee).
The full sizes, as a reader runs them, are the notebooks' own.
"""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
RESOURCES = {"metadata": {"path": str(FOLDER)}}  # the kernel's working directory
SMOKE_SIZES = {
    "colocated_disagg_offload": "NUM_REQUESTS = 200",  # 400 a reader runs
    "fleet_sizing": "PLAN_REQUESTS = 200\nROUTING_REQUESTS = 200",  # 600 and 500
    "saturation_knee": "FIRST_PROBE_REQUESTS = 100\nMAX_PROBE_REQUESTS = 400",  # 200 and 1,600
    "speculative_crossover": "BATCH_SIZES = (1, 16, 128)\nRATES = (10, 80)\nLOAD_REQUESTS = 200",  # 8 sizes, 5 x 1,000
}


@pytest.fixture(scope="module")
def kernel():
    """A started python3 kernel (its manager), shut down after the module's last notebook."""
    starter = NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3", resources=RESOURCES)
    with starter.setup_kernel():
        yield starter.km


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, kernel):
    nb = nbformat.read(path, as_version=4)
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == (path.stem in SMOKE_SIZES), tagged
    if tagged:  # each size set here is one the notebook's parameters cell sets (not a name it no longer reads)
        names = re.findall(r"^(\w+) = ", SMOKE_SIZES[path.stem], flags=re.MULTILINE)
        assert names and all(re.search(rf"^{n} = ", nb.cells[tagged[0]].source, re.MULTILINE) for n in names), names
        nb.cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell(SMOKE_SIZES[path.stem]))
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
