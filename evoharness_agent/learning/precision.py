"""Number formats of training: bf16 autocast where the hardware multiplies bf16 natively, and pays.

Recent GPUs do, and so do CPUs with AVX512-BF16 or AMX; elsewhere bf16 is emulated and slower
than fp32, so autocast stays off. On a CPU it pays only for wide products: the package's own
scorers (a 16-wide state tower, 384x384 maps, tens of candidates) update slower under it, so
``"auto"`` (the default) turns it on for GPUs only and ``True`` on native CPUs too.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Literal

import torch

__all__ = ["cpu_has_native_bf16", "training_autocast"]


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX512-BF16 or AMX), read from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as handle:
            cpuinfo = handle.read()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", cpuinfo) is not None


def training_autocast(device: str, bf16: bool | Literal["auto"] = "auto") -> contextlib.AbstractContextManager:
    """Return the bf16 autocast context of an update on ``device`` (a no-op where bf16 is not native).

    ``bf16``: ``"auto"`` on a GPU only, ``True`` on a CPU too, ``False`` never (see the module).
    """
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    native = torch.cuda.is_bf16_supported() if device_type == "cuda" else cpu_has_native_bf16()
    wanted = device_type == "cuda" if bf16 == "auto" else bf16
    if not (wanted and native):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
