"""Load a file of ``scripts/`` or ``benchmarks/`` (not packages) as a module, to test its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """Return ``<folder>/<name>.py`` (``scripts/`` or ``benchmarks/``) imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import would (importlib's own recipe): a dataclass looks its
    # module up by name, and must find this one, not an earlier module of that name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
