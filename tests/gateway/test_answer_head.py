"""``transport.answer_head.HeldHead``: an answer's head leaves with the start of its body in one write,
and is never held past the event loop's next round (a stream whose first event comes later)."""

from __future__ import annotations

import asyncio

from harnessrl.gateway.transport.answer_head import HeldHead


class RecordingTransport:
    """What a transport was asked to write, call by call (a real one for the parts not recorded)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        self.writes.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def _two_writes_in_one_step() -> list[bytes]:
    transport = RecordingTransport()
    held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    held.write(b"{}")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return transport.writes


def test_a_whole_answer_leaves_in_one_write() -> None:
    assert asyncio.run(_two_writes_in_one_step()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def _head_then_later_events() -> tuple[list[bytes], list[bytes]]:
    transport = RecordingTransport()
    held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    await asyncio.sleep(0)  # the loop's next round: the head is out, no event yet
    after_one_round = list(transport.writes)
    held.write(b"5\r\nhello\r\n")
    held.write(b"0\r\n\r\n")
    return after_one_round, transport.writes


def test_a_stream_head_is_not_held_for_its_first_event() -> None:
    after_one_round, writes = asyncio.run(_head_then_later_events())
    assert after_one_round == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    assert writes == [*after_one_round, b"5\r\nhello\r\n", b"0\r\n\r\n"]


async def _closed_with_a_held_head() -> RecordingTransport:
    transport = RecordingTransport()
    held = HeldHead(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    held.write(b"HTTP/1.1 500 Internal Server Error\r\n\r\n")
    held.close()
    await asyncio.sleep(0)
    return transport


def test_closing_sends_a_held_head_first_and_once() -> None:
    transport = asyncio.run(_closed_with_a_held_head())
    assert transport.writes == [b"HTTP/1.1 500 Internal Server Error\r\n\r\n"]
    assert transport.closed
