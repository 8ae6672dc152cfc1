"""glibc's allocator, set for a long-running trainer: big blocks go back to the system when freed.

torch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold with its own
``mmap`` (and unmaps it on ``free``), but the threshold is dynamic: each freed mmapped block raises
it to that block's size, up to 32 MB on 64-bit. After the first few steps of a run, activations and
KV-cache tensors of a few MB to 32 MB are carved from the heap arenas instead, one arena per thread
that allocates (the trainer, the engine, the event loop, tokenizers: up to 8 x cores arenas), and a
freed block in the middle of an arena is not returned: the process's RSS keeps the step's peak, per
arena, for good.

``tune`` fixes the threshold (``M_MMAP_THRESHOLD``; setting it turns the dynamic adjustment off)
and caps the arenas (``M_ARENA_MAX``); ``release`` returns what the arenas hold free
(``malloc_trim``), called after each optimizer step. Both do nothing where glibc is not the C
library (macOS, musl). The environment's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_ARENA_MAX`` win.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: Blocks from 1 MB up are mmapped: every activation of a micro-batch, every KV-cache layer.
MMAP_THRESHOLD = 1 << 20
ARENA_MAX = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None
    return libc


def tune(env: dict[str, str] | None = None, libc: Any = None) -> bool:
    """Set the mmap threshold and the arena cap (unless the environment sets them); True if set."""
    env = os.environ if env is None else env
    libc = libc or _libc()
    if libc is None:
        return False
    if "MALLOC_MMAP_THRESHOLD_" not in env:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_ARENA_MAX" not in env:
        libc.mallopt(M_ARENA_MAX, ARENA_MAX)
    return True


def release() -> bool:
    """Give the memory the heap arenas hold free back to the system; True if some was."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
