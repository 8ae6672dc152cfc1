"""``coalesce.Outlet``: chunks ready together go out in one write, a lone chunk at once, the bytes are
the same, a failed send is raised; the buffer is bounded (the producer waits), a client slower than
the rate is given up on, and ``settle`` waits for the client's TCP to have all but the slack.

Driven with a plain ``send`` and, for the client's side, ``Link``: a small ``delivery.ClientConnection``
whose socket state the test sets (the real one, over real sockets, is in test_delivery.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from harnessrl.gateway.pipeline.coalesce import RECORD_SLACK_BYTES, ClientTooSlow, Outlet


class Link:
    """A client connection whose writability and unacknowledged bytes the test decides."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.taken_per_window = 0  # bytes "the client reads" each time a window passes while blocked
        self.unsent = 0
        self.ack_delay = 0  # of ``unsent``, what a delayed ACK may be holding (all of it was sent)
        self.windows = 0  # windows that passed while blocked
        self.looks = 0  # times the unacknowledged bytes were asked for

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    async def wait_writable(self, window_s: float, min_bytes_per_s: float) -> bool:
        while not self.writable.is_set():
            try:
                await asyncio.wait_for(self.writable.wait(), window_s)
            except TimeoutError:
                self.windows += 1
                if self.taken_per_window < min_bytes_per_s * window_s:
                    return False
        return True

    def unsent_bytes(self) -> int:
        self.looks += 1
        return self.unsent

    def ack_delay_bytes(self) -> int:
        return self.ack_delay

    def cut(self) -> None:
        pass


def outlet(send: Any, link: Link | None = None, **kw: Any) -> Outlet:
    settings = {"buffer_bytes": 1 << 20, "min_bytes_per_s": 1000.0, "window_s": 0.05, "on_slow": lambda: None}
    return Outlet(send, link, **{**settings, **kw})


def test_chunks_ready_together_are_sent_in_one_write() -> None:
    events = [f"data: {i}\n\n".encode() for i in range(256)]
    sent: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message["body"])

    async def main() -> None:
        out = outlet(send)
        for event in events:
            await out.put(event)  # never waits: all of them are ready at once
        await out.close()

    asyncio.run(main())
    assert sent == [b"".join(events)]


def test_a_lone_chunk_is_sent_before_the_next_one_is_made() -> None:
    async def main() -> list[bytes]:
        sent: list[bytes] = []
        next_token = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["body"])
            if message["body"] == b"first":
                next_token.set()  # the engine "samples" the next token only once this one is out

        out = outlet(send)
        await out.put(b"first")
        await asyncio.wait_for(next_token.wait(), timeout=5)
        await out.put(b"second")
        await out.put(b"third")
        await out.close()
        return sent

    assert asyncio.run(main()) == [b"first", b"secondthird"]


def test_a_failed_send_is_raised_at_the_next_put() -> None:
    async def send(message: dict[str, Any]) -> None:
        raise OSError("client went away")

    async def main() -> int:
        out = outlet(send)
        made = 0
        with pytest.raises(OSError, match="client went away"):
            while True:  # endless: only the failed send can end it
                made += 1
                await out.put(b"x")
                await asyncio.sleep(0)
        return made

    assert asyncio.run(main()) < 10


def test_a_full_buffer_holds_the_producer_until_the_client_takes_it() -> None:
    async def main() -> tuple[int, int, int]:
        link = Link()
        link.writable.clear()  # the socket is full: the client is not reading
        link.taken_per_window = 10**9  # ...but it is not slow either (it reads, just not yet)
        sent: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message["body"])

        out = outlet(send, link, buffer_bytes=1000)
        produced = 0

        async def produce() -> None:
            nonlocal produced
            for _ in range(100):
                await out.put(b"y" * 100)
                produced += 1

        task = asyncio.ensure_future(produce())
        while produced < 10:
            await asyncio.sleep(0)
        for _ in range(50):  # the writer holds one batch, the buffer the next: nothing more is made
            await asyncio.sleep(0)
        held = produced
        link.writable.set()  # the client reads again
        await task
        await out.close()
        return held, produced, len(b"".join(sent))

    held, produced, sent = asyncio.run(main())
    assert held <= 20  # at most two buffers' worth (1000 bytes each) of 100-byte events
    assert (produced, sent) == (100, 10_000)  # control: once the client reads, all of it is made and sent


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Let the loop run until ``condition()`` holds."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0)


@pytest.mark.parametrize("taken", [0, 10**9], ids=["slow", "control"])
def test_a_client_slower_than_the_rate_is_given_up_on(taken: int) -> None:
    async def main() -> tuple[bool, list[str]]:
        link = Link()
        link.writable.clear()
        link.taken_per_window = taken
        calls: list[str] = []

        async def send(message: dict[str, Any]) -> None:
            pass

        out = outlet(send, link, buffer_bytes=100, on_slow=lambda: calls.append("slow"))

        async def produce() -> None:
            while True:
                await out.put(b"z" * 100)  # soon waits for room: the client does not read

        producer = asyncio.ensure_future(produce())
        await until(lambda: bool(calls) or link.windows >= 3)
        try:
            if calls:
                with pytest.raises(ClientTooSlow):
                    await producer  # the producer waiting for room is released, with the news
            else:
                assert not producer.done()  # still waiting for the client
            return bool(calls), calls
        finally:
            producer.cancel()
            out.abandon()

    gave_up, calls = asyncio.run(main())
    if taken == 0:
        assert gave_up and calls == ["slow"]
    else:  # control: the same wait with a client that reads within the rate, three windows long
        assert not gave_up and calls == []


def test_settle_waits_until_the_client_has_all_but_the_slack() -> None:

    async def main() -> list[bool]:
        link = Link()
        link.taken_per_window = 10**9
        link.unsent = RECORD_SLACK_BYTES + 50_000  # the client's TCP has not acknowledged this much yet

        async def send(message: dict[str, Any]) -> None:
            pass

        out = outlet(send, link, window_s=60)
        await out.put(b"a" * 100)
        settled = asyncio.ensure_future(out.settle())
        seen = []
        for unsent in (RECORD_SLACK_BYTES + 20_000, RECORD_SLACK_BYTES + 1, RECORD_SLACK_BYTES):
            looks = link.looks
            await until(lambda looks=looks: link.looks >= looks + 2)  # it looked again, and waits on
            seen.append(settled.done())
            link.unsent = unsent
        await asyncio.wait_for(settled, 5)
        seen.append(settled.done())
        await out.close()
        return seen

    assert asyncio.run(main()) == [False, False, False, True]


@pytest.mark.parametrize("ack_delay", [70_000, 0], ids=["all_sent_ack_delayed", "control_not_all_sent"])
def test_settle_allows_for_a_delayed_ack_of_what_was_sent(ack_delay: int) -> None:
    """An answer's last write of 16-64 KiB on loopback: all of it sent, its ACK delayed by the client's
    kernel (~40 ms). ``settle`` does not wait for that ACK; it does while bytes wait to be sent."""

    async def main() -> tuple[bool, bool]:
        link = Link()
        link.taken_per_window = 10**9
        link.unsent = RECORD_SLACK_BYTES + 40_000
        link.ack_delay = ack_delay

        async def send(message: dict[str, Any]) -> None:
            pass

        out = outlet(send, link, window_s=60)
        await out.put(b"a" * 100)
        settled = asyncio.ensure_future(out.settle())
        looks = link.looks
        await until(lambda: settled.done() or link.looks >= looks + 3)
        at_once = settled.done()
        link.unsent = RECORD_SLACK_BYTES  # acknowledged meanwhile
        await asyncio.wait_for(settled, 5)
        await out.close()
        return at_once, settled.done()

    at_once, done = asyncio.run(main())
    assert done
    assert at_once is (ack_delay > 0)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "control_not_recorded"])
def test_a_recorded_calls_last_bytes_wait_for_a_slow_client(recorded: bool) -> None:
    """Once the call is recorded, cutting its client would leave a recorded call whose end the
    client never got: the writer waits on, however slow the client; before that, it gives up."""

    async def main() -> tuple[list[str], bool]:
        link = Link()
        link.writable.clear()
        calls: list[str] = []

        async def send(message: dict[str, Any]) -> None:
            pass

        out = outlet(send, link, on_slow=lambda: calls.append("slow"), recorded=lambda: recorded)
        await out.put(b"final event")
        await until(lambda: bool(calls) or link.windows >= 3)
        link.writable.set()  # the client reads at last
        if not calls:
            await asyncio.wait_for(out.close(), 5)
        else:
            out.abandon()
        return calls, out.gave_up

    calls, gave_up = asyncio.run(main())
    assert (calls, gave_up) == (([], False) if recorded else (["slow"], True))
