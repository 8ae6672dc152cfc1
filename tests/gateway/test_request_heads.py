"""Request heads (issue 36): caps on their size and header count (431, the connection closed before
anything more is read), and an ``Upgrade`` the gateway does not speak ignored, the body kept.

Raw sockets send the heads; ``curl --http2`` (what sends ``Upgrade: h2c`` on ``http://``) is the real
client of the upgrade test. Every probe has a control that the same connection serves a head just
under the caps, or the same request without the upgrade.
"""

from __future__ import annotations

import json
import resource
import shutil
import socket
import subprocess
import threading
from typing import Any

import httpx
import pytest

from harnessrl.config import GatewayConfig

ADMIN = "test-admin-key"  # conftest.ADMIN_KEY


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` on a new connection; everything received until the gateway closes it."""
    with socket.create_connection(address(url), timeout=30) as sock:
        sock.sendall(request)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
        return got


def health_with(headers: list[str]) -> bytes:
    lines = ["GET /api/health HTTP/1.1", "Host: 127.0.0.1", *headers, "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_defaults() -> None:
    config = GatewayConfig()
    assert (config.max_header_bytes, config.max_headers) == (65536, 100)


@pytest.mark.parametrize("over", ["bytes", "count", "request_line"])
def test_a_head_over_the_caps_is_431_and_the_connection_closed(make_gateway: Any, over: str) -> None:
    gw = make_gateway(max_header_bytes=8192, max_headers=20)
    if over == "bytes":
        too_big, just_under = ["X-Big: " + "a" * 9000], ["X-Big: " + "a" * 7000]
        request, control = health_with(too_big), health_with(just_under)
    elif over == "count":
        request = health_with([f"X-H{i}: v" for i in range(21)])
        control = health_with([f"X-H{i}: v" for i in range(17)])  # + Host and Connection: 19
    else:
        request = f"GET /api/health?{'q' * 9000} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        control = f"GET /api/health?{'q' * 7000} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    answer = exchange(gw.url, request)
    assert answer.startswith(b"HTTP/1.1 431 ")
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_header_fields_too_large"
    assert b"connection: close" in answer.lower()
    # Control: a head just under the caps is served.
    assert exchange(gw.url, control).startswith(b"HTTP/1.1 200 ")


def test_a_head_that_never_ends_is_refused_after_the_cap_not_read_whole(make_gateway: Any) -> None:
    """A 64 MiB header line, unauthenticated: the gateway reads past the cap by at most one read,
    answers 431 and closes; the sender cannot push the rest. Meanwhile other clients are served.
    Control: a 16 MiB *body* (not head) on a route that reads it is taken whole (the probe can tell)."""
    gw = make_gateway(max_body_bytes=32 * 2**20)
    cpu_before = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    sent = {"n": 0}

    def flood(prefix: bytes, total: int) -> None:
        with socket.create_connection(address(gw.url), timeout=30) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            sock.sendall(prefix)
            block = b"a" * 65536
            try:
                while sent["n"] < total:
                    sock.sendall(block)
                    sent["n"] += len(block)
            except OSError:  # reset by the gateway
                pass

    total = 64 * 2**20
    thread = threading.Thread(target=flood, args=(b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Flood: ", total))
    thread.start()
    for _ in range(5):  # other clients are served meanwhile
        assert httpx.get(f"{gw.url}/api/health", timeout=30).status_code == 200
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert sent["n"] < 8 * 2**20, f"the gateway took {sent['n']} bytes of a head capped at 64 KiB"
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu_before
    assert cpu < 20  # (the whole test process: the gateway thread and this client)

    # Control: a body the route reads is taken whole by the same probe.
    sent["n"] = 0
    size = 16 * 2**20
    rollout = gw.rollout()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {rollout['api_key']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size + 65536}\r\n\r\n"
    ).encode()
    flood(head, size)
    assert sent["n"] >= size


#: What ``curl --http2`` adds on http:// (plus ``close``, so the test reads until the gateway closes).
H2C = [
    "Connection: Upgrade, HTTP2-Settings, close",
    "Upgrade: h2c",
    "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
]


@pytest.mark.parametrize("framing", ["content_length", "chunked"])
def test_an_upgrade_the_gateway_does_not_speak_keeps_the_body(make_gateway: Any, framing: str) -> None:
    gw = make_gateway(["Hello there!"])
    rollout = gw.rollout()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    framed = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n" if framing == "chunked" else body
    length = "Transfer-Encoding: chunked" if framing == "chunked" else f"Content-Length: {len(body)}"

    def answered(extra: list[str]) -> dict[str, Any]:
        lines = [
            f"POST /rollouts/{rollout['rollout_id']}/v1/chat/completions HTTP/1.1",
            "Host: 127.0.0.1",
            f"Authorization: Bearer {rollout['api_key']}",
            "Content-Type: application/json",
            length,
            *extra,
        ]
        raw = exchange(gw.url, ("\r\n".join(lines) + "\r\n\r\n").encode() + framed)
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), raw[:300]
        return json.loads(rest)

    with_upgrade = answered(H2C)
    without = answered(["Connection: close"])  # control: the same request without the upgrade
    assert with_upgrade["choices"][0]["message"] == without["choices"][0]["message"]
    calls = gw.store.list_calls(rollout["rollout_id"])
    assert [c.request["messages"] for c in calls] == [[{"role": "user", "content": "hi"}]] * 2


def test_websocket_and_other_upgrades_are_served_as_plain_http(make_gateway: Any) -> None:
    gw = make_gateway()
    for upgrade in ("websocket", "h2c", "TLS/1.2"):
        request = health_with(["Connection: Upgrade", f"Upgrade: {upgrade}", "Sec-WebSocket-Key: x"])
        assert exchange(gw.url, request).startswith(b"HTTP/1.1 200 "), upgrade
    request = b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n"
    assert exchange(gw.url, request).startswith(b"HTTP/1.1 400 ")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_http2_on_http_gets_its_answer(make_gateway: Any) -> None:
    """``curl --http2`` on an http:// URL sends ``Upgrade: h2c`` with its POST (it used to lose its body:
    400 "request body is empty"); the gateway answers in HTTP/1.1 and curl goes on with it."""
    gw = make_gateway(["Hello there!"])
    rollout = gw.rollout()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    for flags in (["--http2"], []):  # the second: control, plain HTTP/1.1
        out = subprocess.run(
            ["curl", "-sS", *flags, "-v", f"{rollout['base_url']}/chat/completions",
             "-H", f"Authorization: Bearer {rollout['api_key']}", "-H", "Content-Type: application/json",
             "-d", body],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert json.loads(out.stdout)["choices"][0]["message"]["content"] == "Hello there!"
        if flags:
            assert "Upgrade: h2c" in out.stderr  # curl did ask
    assert len(gw.store.list_calls(rollout["rollout_id"])) == 2
