"""Where things run and where they are kept: the device rule, the cache folder, safe file writes.

Every part of the package (encoder, trainer, policy, local model, guardrails, recorder) asks
here, so the rules exist once:

* device: ``auto`` means CUDA when a GPU is visible, else the CPU;
* cache: ``$EVOHARNESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/evoharness-agent``, else
  ``~/.cache/evoharness-agent``;
* files: a written file is replaced whole (readers see the old one or the new one, never a
  half), and a log line is appended with one ``O_APPEND`` write, so lines stay whole across
  threads and processes.

Nothing here imports torch at module level: ``from evoharness_agent import EpisodeRecorder``
must stay light.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = [
    "CACHE_ENV_VAR",
    "append_line",
    "atomic_write_bytes",
    "atomic_write_with",
    "atomic_writer",
    "cache_dir",
    "pick_device",
    "set_creation_mode",
]

CACHE_ENV_VAR = "EVOHARNESS_CACHE_DIR"


def pick_device(setting: str | None = "auto") -> str:
    """Resolve ``auto`` (or ``None``) to ``cuda`` when a GPU is present, else ``cpu``; keep anything else."""
    if setting in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def cache_dir() -> Path:
    """Return the cache folder: ``$EVOHARNESS_CACHE_DIR``, else the XDG cache home's ``evoharness-agent``."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "evoharness-agent"


def _umask() -> int:
    """Return the process's umask, read from ``/proc`` where it can be (setting it to read it races other threads)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def set_creation_mode(path: str | Path) -> None:
    """Give ``path`` the mode ``open()`` creates files with (0o666 less the umask).

    Temporary files and safetensors' writer create theirs 0o600: a policy written so could not
    be read by the server's own user, or from a shared folder.
    """
    os.chmod(path, 0o666 & ~_umask())


@contextmanager
def _replacing(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it and rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        set_creation_mode(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | Path) -> Iterator[IO[bytes]]:
    """Yield a binary stream whose content replaces ``path`` whole when the block ends without error.

    The data goes to a temporary file in the same folder, is fsynced, then renamed over
    ``path``; on an error the temporary file is removed and ``path`` is left as it was.
    """
    with _replacing(path) as tmp, open(tmp, "wb") as handle:
        yield handle


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path) as handle:
        handle.write(data)


def atomic_write_with(path: str | Path, write: Callable[[str], None]) -> None:
    """Replace ``path`` atomically with what ``write(tmp_path)`` writes (for writers that want a path)."""
    with _replacing(path) as tmp:
        write(str(tmp))


def append_line(path: str | Path, line: str) -> None:
    """Append one line (a trailing newline is added) to a log file, creating it and its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One O_APPEND write per line keeps lines whole across threads and processes.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)
