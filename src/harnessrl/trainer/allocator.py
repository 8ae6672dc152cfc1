"""glibc's allocator, set for a long-running trainer: the heap reused within a micro-batch, given back
after it.

torch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold with its own
``mmap`` (and unmaps it on ``free``); below it, from heap arenas, one per allocating thread (the
trainer, the engine, the event loop, tokenizers: up to 8 x cores), and a freed block in the middle
of an arena is not returned: left alone, the process's RSS keeps every step's peak for good.

Two ways to bound that cost different things. Mapping every block from 1 MB up (how this module
started) gave each activation fresh pages: 3.2 million page faults, 5 s of kernel time, per step of
the arithmetic example in float32 (14 s instead of 10.6; ``benchmarks/cpu_budget.py``). So blocks up
to 32 MB (every activation and KV-cache layer of SmolLM2's step) come from the heap and are reused
within a micro-batch, and ``release`` (``malloc_trim``, which also hands back free pages in the
middle of an arena) runs after each micro-batch's backward on CPU (``train_step``) and after each
optimizer step: a micro-batch's pages are faulted in once, and what the heap holds free between
micro-batches goes back. ``tune`` fixes the threshold (``M_MMAP_THRESHOLD``; setting it turns glibc's
dynamic adjustment off) and caps the arenas (``M_ARENA_MAX``). Both do nothing where glibc is not the
C library (macOS, musl). The environment's ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_ARENA_MAX`` win.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
#: Blocks from 32 MB up are mmapped (the LM head's chunks, the embedding's gradient); smaller ones,
#: every activation of a micro-batch and every KV-cache layer, come from the heap.
MMAP_THRESHOLD = 32 << 20
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
