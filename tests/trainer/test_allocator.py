"""``trainer.allocator``: glibc's mmap threshold and arena cap are set unless the environment sets
them, and ``release`` hands freed heap memory back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harnessrl.trainer import allocator

pytestmark = pytest.mark.skipif(allocator._libc() is None, reason="not glibc")


def test_release_returns_freed_heap_blocks_to_the_system():
    # In a fresh interpreter: 200 small (heap, not mmapped) blocks of 64 KB, freed but for the last
    # one, which pins the heap's top so glibc's automatic trim cannot shrink it.
    script = f"""
import ctypes, sys
sys.path[:0] = {sys.path!r}
from harnessrl.trainer import allocator
def _rss_kb():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS:")][0].split()[1])
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(64 * 1024) for _ in range(200)]
for b in blocks:
    ctypes.memset(b, 1, 64 * 1024)
for b in blocks[:-1]:
    libc.free(b)
before = _rss_kb()
allocator.release()
print(before - _rss_kb())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) > 5000  # kB: most of the ~12.7 MB freed went back


def test_tune_leaves_settings_from_the_environment_alone():
    calls = []

    class FakeLibc:
        def mallopt(self, option, value):
            calls.append((option, value))

    assert allocator.tune(env={}, libc=FakeLibc())
    assert calls == [(allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD), (allocator.M_ARENA_MAX, 2)]
    calls.clear()
    allocator.tune(env={"MALLOC_ARENA_MAX": "4", "MALLOC_MMAP_THRESHOLD_": "65536"}, libc=FakeLibc())
    assert calls == []
