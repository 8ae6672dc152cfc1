"""What the benchmarks measure the same way: a process's CPU time and the bytes a store's rows hold.

One small library for the scripts beside it (``gateway_overhead.py``, ``gateway_hostile_load.py``,
``store_growth.py``, ``gateways_scaling.py``, ``stream_interval.py``), imported as ``measure`` (a script's folder is on
``sys.path`` when it runs). Every number here is read the same way in every result file, and a fix
to the accounting reaches every script at once. ``shared_fakes`` makes the tests' fakes
(``tests/fakes``) importable, so a benchmark serves the same fake vLLM the tests do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def shared_fakes() -> None:
    """Make ``tests`` this checkout's test folder, as it is under pytest, so ``tests.fakes`` imports:
    verl installs a top-level ``tests`` package of its own into site-packages, which a plain import
    would find first (a folder without ``__init__.py`` only counts when no package of that name is
    found anywhere on the path)."""
    folder = str(Path(__file__).resolve().parent.parent / "tests")
    loaded = sys.modules.get("tests")
    if loaded is None or folder not in list(getattr(loaded, "__path__", [])):
        package = types.ModuleType("tests")
        package.__path__ = [folder]
        sys.modules["tests"] = package


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live children (``/proc``, clock-tick resolution).

    Children count because a server may run its work in a worker process (uvicorn with workers,
    hydra launchers); threads are part of their process's times already.
    """
    total = 0.0
    try:
        total += sum(user_system_seconds(pid))
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(cpu_seconds(int(c)) for c in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass  # the process (or a child) exited: its time is gone with it
    return total


def user_system_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` itself (``/proc``, clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: split after its closing parenthesis.
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK  # utime, stime (fields 14, 15)


def thread_cpu_ns(pid: int) -> dict[tuple[int, int], int]:
    """Nanoseconds on a CPU of each live thread of process ``pid`` and of its live children
    (``/proc/PID/task/TID/schedstat``, first field); empty where the kernel does not keep them."""
    out: dict[tuple[int, int], int] = {}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                out[(pid, int(task))] = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out.update(thread_cpu_ns(int(child)))
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        pass  # exited, or no schedstat: the caller falls back to clock ticks
    return out


CpuSample = tuple[float, dict[tuple[int, int], int]]


def cpu_sample(pid: int) -> CpuSample:
    """Both clocks of ``cpu_seconds_between``: clock ticks (which keep exited threads' time) and each
    live thread's nanoseconds."""
    return cpu_seconds(pid), thread_cpu_ns(pid)


def cpu_seconds_between(before: CpuSample, after: CpuSample) -> float:
    """CPU seconds a process (and its children) used between two samples: from the threads'
    nanoseconds where every thread of ``before`` is still there (a thread started since counts from
    zero), else from clock ticks (an exited thread's nanoseconds went with it). Ticks are 10 ms: a
    40-call batch at ~2 ms a call is ~8 of them, so ticks alone put several percent of noise on a
    batch."""
    ticks_before, ns_before = before
    ticks_after, ns_after = after
    if ns_before and ns_after and ns_before.keys() <= ns_after.keys():
        return sum(ns - ns_before.get(key, 0) for key, ns in ns_after.items()) / 1e9
    return ticks_after - ticks_before


def yardstick_bytes(prompt_tokens: int, response_tokens: int, request: Any) -> int:
    """The issue's measure of one call: prompt + response token IDs as int32, plus the request's JSON
    (compact, as the store writes it)."""
    from harnessrl.store.codecs import dump_json

    return 4 * (prompt_tokens + response_tokens) + len(dump_json(request).encode())


def column_bytes(rows: Sequence[Sequence[Any]]) -> int:
    """Bytes the rows' text and blob columns hold (numbers and NULLs not counted), as
    ``store_growth.py`` counts a rollout's ``calls`` rows (text as UTF-8: the same for ASCII)."""
    return sum(
        len(v.encode()) if isinstance(v, str) else len(v)
        for row in rows
        for v in row
        if isinstance(v, str | bytes)
    )


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded (recorded with every result: the machines are shared)."""
    return [round(x, 2) for x in os.getloadavg()]


# --- the processes a benchmark starts ------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Return once ``url`` answers below 500; raise if ``proc`` (its server) exits first or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before answering {url}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """A list to append started processes to; each is terminated (killed after 15 s) on the way out."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
