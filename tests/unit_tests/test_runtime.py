"""The one place for device, cache-folder and file-writing rules."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from evoharness_agent.runtime import (
    append_line,
    atomic_write_bytes,
    atomic_write_with,
    atomic_writer,
    cache_dir,
    pick_device,
)


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("EVOHARNESS_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("EVOHARNESS_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "evoharness-agent"


def test_pick_device_resolves_auto_only() -> None:
    assert pick_device("cpu") == "cpu"
    assert pick_device("cuda:1") == "cuda:1"
    assert pick_device("auto") in ("cpu", "cuda") and pick_device(None) == pick_device("auto")


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "policy.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic_writer(target) as handle:
        handle.write(b"half of the new")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old"
    with pytest.raises(OSError):
        atomic_write_with(target, lambda tmp: (Path(tmp).write_bytes(b"new"), _raise()))
    assert target.read_bytes() == b"old"
    assert [p.name for p in target.parent.iterdir()] == ["policy.json"]
    atomic_write_with(target, lambda tmp: Path(tmp).write_bytes(b"new"))
    assert target.read_bytes() == b"new"


def test_a_replaced_file_gets_the_mode_a_plain_write_gives(tmp_path: Path) -> None:
    # tempfile makes its files 0o600; what replaces a file must stay as readable as open() would make it.
    previous = os.umask(0o027)
    try:
        atomic_write_bytes(tmp_path / "train_log.json", b"{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "train_log.json").stat().st_mode & 0o777 == 0o640


def _raise() -> None:
    raise OSError("disk full")


def test_appended_lines_stay_whole_across_threads(tmp_path: Path) -> None:
    log = tmp_path / "audit" / "log.jsonl"
    line = "x" * 5000

    def write(k: int) -> None:
        for _ in range(50):
            append_line(log, f"{k}:{line}")

    threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = log.read_text().splitlines()
    assert len(lines) == 400 and all(row.split(":", 1)[1] == line for row in lines)
