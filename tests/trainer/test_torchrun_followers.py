"""A ``harnessrl.trainer.torchrun`` follower's process: how it ends, and its allocator.

A follower whose run ends under it (Ctrl-C, or rank 0 gone) ended in a traceback per follower (a
``KeyboardInterrupt`` inside gloo's broadcast; gloo's ``Connection closed by peer``
``RuntimeError``) that buried rank 0's own one-line message. Now each says what happened in one line
(``follow_until_stopped``). And the entry point sets glibc's allocator as ``harnessrl train`` does
(``trainer.allocator.tune``), on every rank: no rank of a torchrun run had it.

The test launches ``torchrun --standalone --nproc_per_node 2`` (gloo, CPU) on this very file (the
``__main__`` block is the worker): rank 1 runs the real entry point (``torchrun.main``), which
follows; rank 0 joins the world and then waits for the Ctrl-C, leaves it at once, or sends ``stop``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
#: A frame of our module in a traceback: what must not be printed.
OUR_FRAME = 'trainer/torchrun.py", line'


def start(mode: str, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [*TORCHRUN, "--log-dir", str(tmp_path / "logs"), __file__, mode, str(ready)],
        env=ENV,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job is: Ctrl-C reaches all
    )
    return proc, ready


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"torchrun still running after 180 s: {err[-3000:]}")
    return err


def test_ctrl_c_stops_a_follower_in_one_line(tmp_path: Path) -> None:
    proc, ready = start("wait", tmp_path)
    deadline = time.monotonic() + 180
    while not ready.exists():  # rank 0 joined: rank 1 is waiting for its first command
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    time.sleep(1.0)  # rank 1 past init_distributed, into its wait for a command
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: every process of the job
    err = finish(proc)
    assert "harnessrl: rank 1: stopped by SIGINT" in err, err[-3000:]
    assert OUR_FRAME not in err and "KeyboardInterrupt" not in err, err[-3000:]


def test_a_follower_left_by_rank_0_says_so_in_one_line(tmp_path: Path) -> None:
    proc, _ = start("leave", tmp_path)
    err = finish(proc)
    assert "harnessrl: rank 1: a rank went away while this rank waited for rank 0's next command" in err, err[
        -3000:
    ]
    assert "Connection closed by peer" in err  # gloo's reason, in the line
    assert OUR_FRAME not in err and "GLHF" not in err, err[-3000:]


def test_every_rank_tunes_the_allocator(tmp_path: Path) -> None:
    """glibc's default mmaps a fresh 24 MB block (new pages, faulted in on every step); tuned, it
    comes from the heap and is reused. Rank 1 runs the entry point to its end, then allocates."""
    proc, ready = start("stop", tmp_path)
    err = finish(proc)
    assert proc.returncode == 0, err[-3000:]
    assert (ready.parent / "rank1-block").read_text() == "[heap]", err[-3000:]


def _block_mapping(size: int) -> str:
    """The name of the mapping ``malloc(size)`` lands in (``[heap]``, or ``""``: an mmap of its own)."""
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    address = libc.malloc(size)
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            return fields[5] if len(fields) > 5 else ""
    raise AssertionError("the block is in no mapping")


def _worker(mode: str, ready: Path) -> None:
    if os.environ["RANK"] != "0":
        from harnessrl.trainer.torchrun import main

        status = main([])
        if mode == "stop":
            (ready.parent / f"rank{os.environ['RANK']}-block").write_text(_block_mapping(24 << 20))
        sys.exit(status)
    import torch.distributed as dist

    from harnessrl.trainer.distributed import init_distributed

    ctx = init_distributed()
    ready.write_text("joined\n")
    if mode == "stop":
        dist.broadcast_object_list([("stop", (), {})], src=0, group=ctx.control)
        dist.destroy_process_group()
        return
    if mode == "leave":
        time.sleep(0.5)  # rank 1 is in its wait for a command
        os._exit(0)  # a clean exit: torchrun waits for rank 1 instead of stopping it
    try:
        time.sleep(600)
    except KeyboardInterrupt:  # rank 0's own stop is lead()'s (tested in test_torchrun_stops)
        os._exit(130)


if __name__ == "__main__":
    _worker(sys.argv[1], Path(sys.argv[2]))
