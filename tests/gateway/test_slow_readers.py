"""Streams under backpressure (issue 36): a bounded buffer per stream, slow readers cut off and their
calls dropped, and a stream recorded only once its client's TCP has all but the last 16 KiB.

Raw sockets with a small receive buffer play the client, so what the client has not read cannot
hide in its kernel; the engine is the scripted one, counting what it samples (``CountingEngine``).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harnessrl.gateway.pipeline.coalesce import RECORD_SLACK_BYTES

LONG = "word " * 20000  # 20,000 tokens; with logprobs about 7 MB of events
RCVBUF = 4096  # the client's receive buffer (Linux doubles it)
#: What the gateway's kernel may take of a stream its client does not read (Linux autotunes a
#: socket's send buffer up to ``net.ipv4.tcp_wmem``'s maximum, 4 MiB by default).
KERNEL_SEND_BUFFER = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])


def eventually(condition: Callable[[], Any], timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def dropped(gw: Any, reason: str) -> float:
    prefix = f'harnessrl_calls_dropped_total{{api="chat.completions",reason="{reason}"}} '
    rows = [r for r in gw.client.metrics().splitlines() if r.startswith(prefix)]
    return float(rows[0].rsplit(" ", 1)[1]) if rows else 0.0


def open_stream(rollout: dict[str, Any], rcvbuf: int | None = RCVBUF, **fields: Any) -> socket.socket:
    """A socket (receive buffer ``rcvbuf``; None: the kernel's default) that has sent one streaming
    chat request with logprobs."""
    host, port = rollout["base_url"].removeprefix("http://").split("/")[0].split(":")
    path = "/" + rollout["base_url"].removeprefix("http://").split("/", 1)[1] + "/chat/completions"
    body = json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "go"}],
            "stream": True,
            "logprobs": True,
            **fields,
        }
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connecting: the window
    sock.settimeout(30)
    sock.connect((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {rollout['api_key']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def read_to_end(
    sock: socket.socket, step: int = 65536, between: Callable[[int], None] | None = None
) -> bytes:
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(step)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
        if between is not None:
            between(len(got))
        if got.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            break
    return bytes(got)


@pytest.mark.parametrize("reader", ["stalled", "trickle"])
def test_a_slow_reader_is_cut_off_and_its_call_dropped(make_gateway: Any, reader: str) -> None:
    gw = make_gateway(
        [LONG],
        counting=True,
        context_length=32768,
        stream_buffer_bytes=16384,
        slow_reader_window_s=2,  # the control reads fast: a 2 s stall of this process must not cut it
        slow_reader_bytes_per_s=100_000,
    )
    total = len(gw.engine.turn_token_ids(0))
    rollout = gw.rollout()
    sock = open_stream(rollout)
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200")
    # "stalled" reads nothing more; "trickle" reads 16 bytes every 50 ms (320 B/s), far below the rate.
    while dropped(gw, "slow_reader") == 0.0:
        if reader == "trickle":
            sock.recv(16)
        time.sleep(0.05)
    eventually(lambda: gw.engine.running == 0)
    # The generation waited for the client: held by the full buffers, well before the answer's end.
    per_token = 7_000_000 / 20_000
    assert gw.engine.sampled < min(0.8 * total, (KERNEL_SEND_BUFFER + 3 * 16384 + 65536 + 2**20) / per_token)
    assert gw.store.list_calls(rollout["rollout_id"]) == []
    sock.close()

    # Control: a client that reads as fast as it can gets the whole answer, recorded.
    with open_stream(rollout) as fast:
        body = read_to_end(fast)
    assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    [call] = gw.store.list_calls(rollout["rollout_id"])
    assert len(call.response_token_ids) == total
    assert dropped(gw, "slow_reader") == 1.0


@pytest.mark.parametrize("rcvbuf", [RCVBUF, 2**21], ids=["small_rcvbuf", "control_big_rcvbuf"])
def test_a_stream_is_recorded_once_its_client_has_all_but_the_slack(make_gateway: Any, rcvbuf: int) -> None:
    """The client reads its stream 1 KiB at a time, at about 1 MB/s, and between reads looks whether
    the call is recorded yet: it must not be while more than the slack (plus what the client's
    kernel holds) is on its way. Control: a client with a 2 MiB receive buffer that lets the whole
    answer arrive before it reads any: its kernel took (and acknowledged) it all, so the call is
    recorded long before the application has read it; the probe notices such a record."""
    gw = make_gateway([LONG[: 5 * 6000]], context_length=16384, counting=True)
    rollout = gw.rollout()
    seen: dict[str, int] = {}

    def look(received: int) -> None:
        if "at" not in seen and gw.store.count_calls(rollout["rollout_id"]) == 1:
            seen["at"] = received
        time.sleep(0.001)  # the application's pace: ~1 MB/s

    with open_stream(rollout, rcvbuf=rcvbuf) as sock:
        if rcvbuf != RCVBUF:
            eventually(lambda: gw.engine.started == 1 and gw.engine.running == 0)
        body = read_to_end(sock, step=1024, between=look)
    assert body.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    final = len(body) - body.rindex(b"data: {")  # the final events: the finish_reason chunk, [DONE]
    still_on_its_way = len(body) - seen["at"]
    bound = RECORD_SLACK_BYTES + 4 * RCVBUF + final
    if rcvbuf == RCVBUF:
        assert still_on_its_way <= bound
    else:
        assert still_on_its_way > len(body) // 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's send queue is Linux's")
@pytest.mark.parametrize("reading", [True, False], ids=["all_sent", "control_peer_not_reading"])
def test_ack_delay_bytes_counts_only_what_was_sent(reading: bool) -> None:
    """``heads.ack_delay_bytes`` on real loopback sockets: two segments once all that was written was
    sent (what a delayed ACK may hold); 0 while bytes wait in the send queue because the peer's window
    is full (a client that does not read is no delayed ACK)."""
    from harnessrl.gateway.transport.heads import ack_delay_bytes

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        client.connect(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            peer.setblocking(False)
            if reading:
                peer.send(b"x" * 3000)
                eventually(lambda: ack_delay_bytes(peer) > 0, what="the bytes sent")
                segment = peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
                assert ack_delay_bytes(peer) == 2 * segment
            else:
                with contextlib.suppress(BlockingIOError):
                    while True:  # fill the client's window and the gateway side's send queue
                        peer.send(b"x" * 65536)
                assert ack_delay_bytes(peer) == 0
