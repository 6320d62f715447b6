"""Every notebook in notebooks/ runs to its end with nbclient, as committed, on a copy of
the folder in a temporary directory (so its traces go there), and prints what the
committed notebook shows; the committed notebooks hold the outputs of a run, figures
included, at a size a repository page shows. ``python notebooks/build.py`` writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.printed import differences

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))
EXPECTED = ["01_quickstart", "02_llama_eager_vs_compiled", "03_nki_matmul_step_by_step", "04_hub_kernel_speedup",
            "05_distributed_tp_fsdp"]
# the libraries a notebook imports beyond trnsim's own dependencies
NEEDS = {"04_hub_kernel_speedup": ("kernels", "transformers")}
CELL_TIMEOUT_S = 300
MAX_BYTES = 1_500_000


def _missing(modules: tuple[str, ...]) -> str | None:
    for m in modules:
        if importlib.util.find_spec(m) is None:
            return f"{m} is not installed: install trnsim's test extra (pip install -e .[test])"
    return None


def test_the_notebooks_are_there():
    assert set(EXPECTED) <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_shows_a_run(path):
    """Every code cell ran, in order, without an error; figures are stored as PNG."""
    assert path.stat().st_size < MAX_BYTES
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path, monkeypatch):
    if reason := _missing(("nbclient", "nbformat", "ipykernel", *NEEDS.get(path.stem, ()))):
        pytest.skip(reason)
    import nbformat
    from nbclient import NotebookClient

    work = tmp_path / "notebooks"
    shutil.copytree(FOLDER, work, ignore=shutil.ignore_patterns("out", "__pycache__", "*.ipynb"))
    # the kernel imports this checkout's trnsim and finds the trnsim command beside its python
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    committed = nbformat.read(path, as_version=4)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # raises CellExecutionError, naming the cell and its traceback, if a cell fails
    NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                   resources={"metadata": {"path": str(work)}}).execute()
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # simulated times are deterministic: the committed text (its tables, times, counts)
    # is what a run prints today, up to the host's rounding noise (tests/printed.py)
    for i, (old, new) in enumerate(zip(committed.cells, nb.cells)):
        if new.cell_type == "code" and (found := differences(_printed(old), _printed(new))):
            pytest.fail(f"{path.name} cell {i} prints\n{_printed(new)}\nnot the committed\n{_printed(old)}\n"
                        + "\n".join(found) + f"\nrun `python notebooks/build.py {path.stem}`, check its text, "
                        "and commit it")


def _printed(cell) -> str:
    """What a code cell printed to stdout, as one string (messages cut where the host's timing fell)."""
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
