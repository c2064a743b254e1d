"""Every notebook in examples/ runs top to bottom in a fresh kernel, offline; none is committed with outputs.

Run times on 2 shared CPU cores are in README.md (Examples); the notebooks that take over a
minute there are slow tests (``make test-slow``), so the default run stays short.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
# What each notebook needs beyond the core install (module names).
NEEDS = {
    "01_quickstart.ipynb": ("xllamacpp", "bfcl_eval"),
    "02_fine_tune_on_your_logs.ipynb": ("matplotlib",),
    "03_drop_in_replacement.ipynb": ("xllamacpp", "bfcl_eval", "langchain_classic"),
    "04_langchain_v1_middleware.ipynb": ("xllamacpp", "bfcl_eval", "langchain"),
    "05_serve.ipynb": ("fastapi", "uvicorn", "httpx"),
    "06_guardrails_and_recorder.ipynb": ("xllamacpp", "bfcl_eval"),
    "07_online_evaluation_and_collection.ipynb": ("bfcl_eval",),
}
SLOW = {"01_quickstart.ipynb", "02_fine_tune_on_your_logs.ipynb", "03_drop_in_replacement.ipynb",
        "04_langchain_v1_middleware.ipynb", "06_guardrails_and_recorder.ipynb",
        "07_online_evaluation_and_collection.ipynb"}


def test_there_are_examples() -> None:
    assert {path.name for path in NOTEBOOKS} == set(NEEDS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_no_outputs_are_committed(path: Path) -> None:
    notebook = json.loads(path.read_text())
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, (
                f"{path.name} cell {number} has outputs: run nbstripout {path}")


@pytest.mark.parametrize("path", [pytest.param(path, marks=pytest.mark.slow) if path.name in SLOW else path
                                  for path in NOTEBOOKS], ids=lambda path: path.stem)
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = [module for module in NEEDS[path.name] if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors
    # Every code cell ran and the last one printed or displayed something.
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code)
    assert code[-1].get("outputs")
