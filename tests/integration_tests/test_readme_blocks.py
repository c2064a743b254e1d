"""Every Python block of the README runs, top to bottom in one namespace, as a reader would paste them.

A block preceded by a ``<!-- readme-test: skip (reason) -->`` line is not run (the client block: it needs a server).
The blocks run the shipped policy and the local LLM, so the test is slow.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"(<!-- readme-test: skip[^>]*-->\n)?```python\n(.*?)```", re.S)


def python_blocks() -> list[str]:
    return [code for skip, code in BLOCK.findall(README.read_text()) if not skip]


def test_there_are_python_blocks() -> None:
    assert len(python_blocks()) >= 4


def test_every_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("the README's blocks use LocalChatModel: needs the local extra")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the blocks write runs.jsonl and audit.jsonl where they run
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for number, code in enumerate(python_blocks(), 1):
        try:
            exec(compile(code, f"README.md python block {number}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(f"README python block {number} failed:\n{code}") from error
