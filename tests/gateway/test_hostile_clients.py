"""Fuzz the transport (issue 36; the input fuzz, test_input_fuzz.py, is its other half): crowds of
clients that behave badly at random — leave mid-answer, half-close, reset, read too slowly, send
oversized heads or ``Upgrade: h2c`` — alongside clients that behave, and rollouts finished under
their calls, against one real gateway kept across all examples (a slowed scripted engine).

After every crowd: the store holds exactly the calls whose clients received their final event
(a whole JSON answer, or ``[DONE]`` / ``response.completed`` / ``message_stop``), each rollout's
``metadata.dropped_calls`` counts the others by reason, nothing is in flight, and the gateway still
answers. Clients leave by time, at most half-way through an answer that cannot be generated in
less than 1.5 s, so none leaves inside the documented record-before-final-event window.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harnessrl.store.base import DROPPED_CALLS_KEY

DELAY_S = 0.005
ANSWER = "word " * 300  # >= 1.5 s at DELAY_S a token, longer under load
API_PATHS = {"chat": "chat/completions", "responses": "responses", "messages": "messages"}

BEHAVIOURS = ("stays", "leaves", "half_closes", "resets", "stalls", "rollout_finished", "big_head", "h2c")


@dataclass
class Client:
    behaviour: str
    api: str
    stream: bool
    leave_after_s: float
    received_final: bool = False
    status: int = 0
    log: list[str] = field(default_factory=list)


def _client(behaviour: str, api: str, stream: bool, leave_after_s: float) -> Client:
    if behaviour == "stalls":  # slow readers are a stream's (a whole answer is one write)
        api, stream = "chat", True
    return Client(behaviour, api, stream, leave_after_s)


CLIENTS = st.builds(
    _client,
    behaviour=st.sampled_from(BEHAVIOURS),
    api=st.sampled_from(sorted(API_PATHS)),
    stream=st.booleans(),
    leave_after_s=st.floats(min_value=0.05, max_value=0.6),
)


def request_bytes(rollout: dict[str, Any], client: Client) -> bytes:
    path = f"/rollouts/{rollout['rollout_id']}/v1/{API_PATHS[client.api]}"
    if client.api == "chat":
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    elif client.api == "responses":
        body = {"model": "m", "input": "go"}
    else:
        body = {"model": "m", "max_tokens": 1000, "messages": [{"role": "user", "content": "go"}]}
    if client.behaviour == "stalls":  # a stream with logprobs: ~100 KB, more than the kernels take
        body = {**body, "logprobs": True}
    raw = json.dumps({**body, "stream": client.stream}).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"x-api-key: {rollout['api_key']}"]
    head += ["Content-Type: application/json", f"Content-Length: {len(raw)}"]
    if client.behaviour == "big_head":
        head += [f"X-Junk-{i}: {'j' * 1000}" for i in range(80)]  # past the 64 KiB cap
    if client.behaviour == "h2c":
        head += ["Connection: Upgrade, HTTP2-Settings, close", "Upgrade: h2c", "HTTP2-Settings: AAMAAABk"]
    else:
        head += ["Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


def final_event_in(client: Client, answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        return False
    if not client.stream:
        return b'"usage"' in body  # a whole JSON answer (every API's has its usage)
    if client.api == "responses":  # (every Response object carries an "error": null)
        return b"event: response.completed" in body or b"event: response.incomplete" in body
    if client.api == "messages":
        return b"event: message_stop" in body and b"event: error" not in body
    return b"data: [DONE]" in body and b'data: {"error"' not in body


def run_client(gw: Any, rollout: dict[str, Any], client: Client) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if client.behaviour == "stalls":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    try:
        sock.sendall(request_bytes(rollout, client))
        if client.behaviour == "rollout_finished":
            time.sleep(client.leave_after_s)  # the run gives up on the rollout mid-call
            gw.client.finish_rollout(rollout["rollout_id"], "success", 0.0)
        elif client.behaviour in ("leaves", "half_closes", "resets"):
            time.sleep(client.leave_after_s)  # the harness's patience, shorter than the answer
            if client.behaviour == "half_closes":
                sock.shutdown(socket.SHUT_WR)
            elif client.behaviour == "resets":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if client.behaviour != "half_closes":
                return
        elif client.behaviour == "stalls":
            sock.recv(64)  # then reads nothing more, until the gateway has given up on it
            eventually(lambda: gw.store.get_rollout(rollout["rollout_id"]).metadata.get(DROPPED_CALLS_KEY))
            return
        got = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        client.status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0
        client.received_final = final_event_in(client, got)
    finally:
        sock.close()


def eventually(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.slow
def test_hostile_clients_leave_only_the_calls_they_received(make_gateway: Any) -> None:
    """~1 minute on 2 cores: 12 crowds of up to 6 clients."""
    gw = make_gateway(
        [ANSWER],
        token_delay_s=DELAY_S,
        counting=True,
        slow_reader_window_s=0.3,
        slow_reader_bytes_per_s=50_000,
        stream_buffer_bytes=8192,
    )
    seen: dict[str, int] = {}

    every = [_client(b, sorted(API_PATHS)[i % 3], i % 2 == 0, 0.3) for i, b in enumerate(BEHAVIOURS)]

    @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(CLIENTS, min_size=1, max_size=6))
    @example(every)  # every behaviour at least once, whatever is drawn
    def crowd(clients: list[Client]) -> None:
        rollouts = [gw.rollout() for _ in clients]
        threads = [
            threading.Thread(target=run_client, args=(gw, r, c))
            for r, c in zip(rollouts, clients, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        eventually(lambda: gw.client.state()["in_flight"] == 0 and gw.engine.running == 0)
        for rollout, client in zip(rollouts, clients, strict=True):
            seen[client.behaviour] = seen.get(client.behaviour, 0) + 1
            calls = gw.store.list_calls(rollout["rollout_id"])
            what = (client, len(calls))
            assert len(calls) == (1 if client.received_final else 0), what
            if client.behaviour in ("stays", "h2c"):
                assert client.received_final, what  # the control: a client that behaves gets its answer
            if client.behaviour == "big_head":
                assert client.status == 431, what
            expected = {
                "leaves": "client_gone", "half_closes": "client_gone", "resets": "client_gone",
                "stalls": "slow_reader", "rollout_finished": "rollout_ended",
            }.get(client.behaviour)  # fmt: skip
            if expected is not None:
                rid = rollout["rollout_id"]
                eventually(lambda rid=rid: gw.store.get_rollout(rid).metadata.get(DROPPED_CALLS_KEY))
                assert gw.store.get_rollout(rid).metadata[DROPPED_CALLS_KEY] == {expected: 1}, what

    crowd()
    assert set(seen) == set(BEHAVIOURS)
    # The gateway still answers a client that behaves.
    rollout = gw.rollout()
    r = httpx.post(
        f"{rollout['base_url']}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
        timeout=30,
    )
    assert r.status_code == 200 and len(gw.store.list_calls(rollout["rollout_id"])) == 1
