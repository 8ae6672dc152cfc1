"""What this machine computes fast: whether bfloat16 is native on its CPU.

bfloat16 matrix products are fast on CPUs with AMX or AVX512-BF16 (recent Intel Xeons, AMD Zen 4+)
and *emulated* elsewhere: on an AVX2 AMD EPYC a (1000 x 49152) @ (49152 x 576) product took 81 s in
bf16 against 0.5 s in float32 (torch 2.13.0+cpu), which made a SmolLM2 training step take over ten
minutes. ``engine.dtype = "auto"`` and ``trainer.autocast = "auto"`` pick bf16 only where it is native.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@functools.cache
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU advertises AMX-BF16 or AVX512-BF16 (Linux ``/proc/cpuinfo`` flags); False
    when it does not or the file cannot be read (then float32 is the safe choice)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            return bool(_BF16_FLAGS & set(line.partition(":")[2].split()))
    return False


def resolve_dtype(dtype: str, device: str, *, native_bf16: Callable[[], bool] = cpu_has_native_bf16) -> str:
    """``engine.dtype``: ``"auto"`` is bfloat16 on a GPU or a CPU with ``native_bf16``, else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if not device.startswith("cpu") or native_bf16() else "float32"


def resolve_autocast(
    autocast: str, on_gpu: bool, *, native_bf16: Callable[[], bool] = cpu_has_native_bf16
) -> str:
    """``trainer.autocast``: ``"auto"`` is bf16 on a GPU or a CPU with ``native_bf16``, else none."""
    if autocast != "auto":
        return autocast
    return "bf16" if on_gpu or native_bf16() else "none"
