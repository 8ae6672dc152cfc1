"""``GatewayClient.pause`` on a gateway that accepted the request and never answers.

``pause()`` without a timeout sent none to the gateway and set no HTTP timeout, so a stalled
gateway held the caller forever. Now the drain timeout (the client's ``pause_timeout_s`` when not
told) is always sent and the HTTP wait is bounded by it plus the client's ``timeout``.
The stalled gateway is a real listening socket on 127.0.0.1 that accepts and reads, never writes.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from harnessrl.client import GatewayClient
from harnessrl.errors import UpstreamError


@pytest.fixture
def stalled_gateway() -> Iterator[str]:
    """A URL whose server accepts every connection, reads the request and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    accepted = threading.Event()

    def accept_and_hold() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the end of the test
                return
            held.append(conn)
            accepted.set()

    thread = threading.Thread(target=accept_and_hold, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
        assert accepted.is_set(), "the client never connected"
    finally:
        server.close()
        for conn in held:
            conn.close()
        thread.join(timeout=5)


def _pause_in_thread(client: GatewayClient) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def pause() -> None:
        try:
            client.pause()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    return thread, raised


def test_pause_without_a_timeout_gives_up_on_a_stalled_gateway(stalled_gateway: str) -> None:
    with GatewayClient(stalled_gateway, "admin", timeout=0.2, pause_timeout_s=0.3) as client:
        thread, raised = _pause_in_thread(client)
        thread.join(timeout=30)  # a hang guard, not a timing: the bound is 0.5 s
        assert not thread.is_alive(), "pause() still waiting on a gateway that never answers"
    assert len(raised) == 1 and isinstance(raised[0], UpstreamError), raised
    assert "unreachable" in str(raised[0])
