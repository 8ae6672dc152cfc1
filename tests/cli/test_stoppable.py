"""``run_stoppable``: Ctrl-C and SIGTERM cancel the work through the event loop, never from inside
whatever callback the loop is running when the signal lands.

CI once printed ``InvalidStateError`` out of ``asyncio.run``'s own SIGINT handler: it cancels the
main task from Python code, so a signal landing inside the loop's ``_set_result_unless_cancelled``,
between its "cancelled?" check and ``set_result``, cancels the very future being set. The scripts
here land the signal exactly there (a callback that checks, signals itself, then sets), so the race
is hit every time, not once in hundreds of runs. Each runs in its own process: a signal sent to a
pytest worker would stop the worker.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A callback shaped like asyncio's _set_result_unless_cancelled, with the signal sent in the window.
SCRIPT = """
import asyncio, os, signal, sys

from harnessrl.cli.rollout import Terminated, run_stoppable

SIG = getattr(signal, sys.argv[2])
events = []


async def work():
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def set_unless_cancelled():
        if fut.cancelled():
            return
        os.kill(os.getpid(), SIG)  # Python runs its signal handler right after this call returns
        fut.set_result(None)

    loop.call_soon(set_unless_cancelled)
    try:
        await fut
        events.append("set")
        await asyncio.sleep(30)
        events.append("not stopped")
    finally:
        await asyncio.sleep(0.01)  # cleanup that awaits, as the stack's does
        events.append("cleaned up")


try:
    if sys.argv[1] == "plain":
        asyncio.run(work())
    else:
        run_stoppable(work())
except KeyboardInterrupt:
    events.append("KeyboardInterrupt")
except Terminated:
    events.append("Terminated")
print(" ".join(events))
"""


def run(mode: str, signal_name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), mode, signal_name],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ctrl_c_landing_inside_a_loop_callback_stops_the_work_without_a_traceback():
    result = run("stoppable", "SIGINT")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["set", "cleaned", "up", "KeyboardInterrupt"], result.stderr
    assert result.stderr == ""


def test_control_asyncio_runs_own_handler_prints_the_invalid_state_traceback_there():
    # The probe above would notice the bug: the same script under plain asyncio.run logs it.
    result = run("plain", "SIGINT")
    assert "InvalidStateError" in result.stderr and "Traceback" in result.stderr
    assert result.stdout.split()[-1] == "KeyboardInterrupt"


def test_sigterm_stops_the_work_the_same_way_and_says_so():
    result = run("stoppable", "SIGTERM")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["set", "cleaned", "up", "Terminated"], result.stderr
    assert result.stderr == ""


def test_a_second_ctrl_c_during_the_cleanup_ends_it_at_once():
    # A cleanup that hangs can still be ended from the keyboard: the first signal's handler is gone.
    script = """
import asyncio, os, signal, threading

from harnessrl.cli.rollout import run_stoppable


async def work():
    try:
        await asyncio.sleep(30)
    finally:
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, during the cleanup
        await asyncio.sleep(30)  # a cleanup that hangs
        print("the cleanup was not ended")


threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    run_stoppable(work())
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert result.stdout.strip() == "KeyboardInterrupt", result.stderr


def test_with_again_ignore_a_second_signal_lets_the_cleanup_finish():
    # torchrun's rank 0: a Ctrl-C arrives twice (terminal and torchrun); the shutdown must not be cut.
    script = """
import asyncio, os, signal, threading

from harnessrl.stop_signals import Signalled, until_signalled


async def work():
    try:
        await asyncio.sleep(30)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # the second signal, during the cleanup
        await asyncio.sleep(0.2)
        print("cleaned up")


async def main():
    try:
        await until_signalled(work(), again="ignore")
    except Signalled as exc:
        print(signal.Signals(exc.signum).name)


threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
asyncio.run(main())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert result.stdout.split() == ["cleaned", "up", "SIGINT"], result.stderr
    assert result.returncode == 0, result.stderr
