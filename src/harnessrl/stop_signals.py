"""Async work stopped by SIGINT or SIGTERM through the event loop: the commands' clean Ctrl-C.

``until_signalled`` cancels the work from a handler the event loop runs (``loop.add_signal_handler``),
so the work's ``finally`` blocks do the clean shutdown (harnesses killed, rollouts requeued, gateway
and engine closed), then raises ``Signalled``. Used by ``harnessrl rollout``, ``data calibrate``,
``train`` and torchrun's rank 0, each turning ``Signalled`` into its own ending.

Not ``asyncio.run``'s own SIGINT handler: it cancels the main task from inside whatever Python code
runs when the signal lands, and landing inside the loop's ``_set_result_unless_cancelled``, between
its "cancelled?" check and ``set_result``, printed an ``InvalidStateError`` traceback (seen once in
CI, in ``data calibrate``'s Ctrl-C test). Without any handler, SIGTERM ended the process at once and
left its rollouts ``running`` in the store.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class Signalled(Exception):
    """``until_signalled``'s work was cancelled by the signal ``signum`` and has finished its cleanup."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


async def until_signalled(
    work: Coroutine[Any, Any, T], *, again: Literal["default", "ignore"] = "default"
) -> T:
    """``await work``; the first SIGINT or SIGTERM cancels it, and once it has unwound ``Signalled``
    is raised. ``again``: what a later signal does during that cleanup. ``"default"``: the signal's
    default action, so a cleanup that hangs can still be ended from the keyboard. ``"ignore"``:
    nothing (torchrun's rank 0 gets a Ctrl-C twice, from the terminal and forwarded by torchrun, and
    torchrun kills a hung shutdown itself). A SIGINT the process was started ignoring (a job of a
    non-interactive shell: ``cmd &``) stays ignored, as Python itself does; SIGTERM is always handled."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []
    handled = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]

    def on_signal(signum: int) -> None:
        if received:  # only with again="ignore": the default-action handlers were removed
            return
        received.append(signum)
        if again == "default":
            for each in handled:
                loop.remove_signal_handler(each)
        task.cancel()

    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await work
    except asyncio.CancelledError:
        if not received:
            raise
        task.uncancel()
        raise Signalled(received[0]) from None
    finally:
        if not received or again == "ignore":
            for signum in handled:
                loop.remove_signal_handler(signum)
