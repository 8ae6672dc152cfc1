"""A call is training data only if its harness received it (issue 36): calls whose client left, or
whose rollout ended, are cancelled at the engine and never recorded — every API, streamed or not.

Real clients (the official openai and anthropic SDKs with short timeouts, raw sockets for half-close
and resets) against the real gateway on 127.0.0.1, with a slowed scripted engine that counts what
it samples (``CountingEngine``): "the engine stopped" is ``running == 0`` long before the answer
could have ended, and ``sampled`` is less than the answer. Each probe has a control: the same call
with a client that stays is recorded, its whole answer sampled.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from harnessrl.schemas import Outcome
from harnessrl.store.base import DROPPED_CALLS_KEY
from harnessrl.store.sqlite import SQLiteStore

ANSWER = "word " * 300  # 300 tokens: 15 s at 0.05 s a token, far longer than any wait below
DELAY_S = 0.05
APIS = ("chat", "responses", "messages")


def eventually(condition: Callable[[], Any], timeout_s: float = 60.0, what: str = "") -> None:
    """Wait (polling) until ``condition()`` holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def metric(gw: Any, line: str) -> float:
    for row in gw.client.metrics().splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


def dropped(gw: Any, api: str, reason: str) -> float:
    return metric(gw, f'harnessrl_calls_dropped_total{{api="{api}",reason="{reason}"}}')


def drops_in_store(gw: Any, rollout_id: str) -> dict[str, int]:
    return gw.store.get_rollout(rollout_id).metadata.get(DROPPED_CALLS_KEY, {})


def call_with_sdk(
    gw: Any, rollout: dict[str, Any], api: str, *, stream: bool, timeout: float, **kw: Any
) -> str:
    """Make one call the way each SDK does; returns the answer's text (raises what the SDK raises).
    A stream is read to its end unless ``leave_after`` events were read (then the SDK closes it)."""
    leave_after = kw.pop("leave_after", None)
    retries = kw.pop("max_retries", 0)
    messages = [{"role": "user", "content": "go"}]
    if api == "messages":
        client = anthropic.Anthropic(
            base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}",
            api_key=rollout["api_key"],
            timeout=timeout,
            max_retries=retries,
        )
        if not stream:
            return (
                client.messages.create(model="m", max_tokens=kw.get("max_tokens", 1000), messages=messages)
                .content[0]
                .text
            )
        events = client.messages.create(
            model="m", max_tokens=kw.get("max_tokens", 1000), messages=messages, stream=True
        )
        text = ""
        for n, event in enumerate(events):
            if leave_after is not None and n >= leave_after:
                events.close()
                return text
            if event.type == "content_block_delta":
                text += event.delta.text
        return text
    client = openai.OpenAI(
        base_url=rollout["base_url"], api_key=rollout["api_key"], timeout=timeout, max_retries=retries
    )
    if api == "responses":
        if not stream:
            return client.responses.create(
                model="m", input="go", max_output_tokens=kw.get("max_tokens")
            ).output_text
        events = client.responses.create(
            model="m", input="go", stream=True, max_output_tokens=kw.get("max_tokens")
        )
        text = ""
        for n, event in enumerate(events):
            if leave_after is not None and n >= leave_after:
                events.close()
                return text
            if event.type == "response.output_text.delta":
                text += event.delta
        return text
    if not stream:
        answer = client.chat.completions.create(model="m", messages=messages, max_tokens=kw.get("max_tokens"))
        return answer.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model="m", messages=messages, stream=True, max_tokens=kw.get("max_tokens")
    )
    text = ""
    for n, chunk in enumerate(chunks):
        if leave_after is not None and n >= leave_after:
            chunks.close()
            return text
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


API_NAMES = {"chat": "chat.completions", "responses": "responses", "messages": "messages"}
TIMEOUTS = (openai.APITimeoutError, anthropic.APITimeoutError)


# -- the client leaves ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_a_client_that_leaves_cancels_its_call_and_leaves_no_record(
    make_gateway: Any, api: str, stream: bool
) -> None:
    gw = make_gateway([ANSWER], token_delay_s=DELAY_S, counting=True)
    total = len(gw.engine.turn_token_ids(0))
    rollout = gw.rollout()
    if stream:  # the harness stops reading after a few events and closes the stream
        call_with_sdk(gw, rollout, api, stream=True, timeout=30, leave_after=4)
    else:  # the SDK's read timeout fires mid-generation and it closes the connection (5 s: the
        # call must reach the engine first, on a loaded machine too; 100 of the answer's 300 tokens)
        with pytest.raises(TIMEOUTS):
            call_with_sdk(gw, rollout, api, stream=False, timeout=5)
    eventually(lambda: gw.engine.running == 0, what="the generation to be cancelled")
    assert 0 < gw.engine.sampled < total // 2
    assert gw.store.list_calls(rollout["rollout_id"]) == []
    assert dropped(gw, API_NAMES[api], "client_gone") == 1.0
    assert metric(gw, "harnessrl_client_disconnects_total") == 1.0
    assert metric(gw, "harnessrl_dropped_tokens_total") == gw.engine.sampled
    eventually(lambda: drops_in_store(gw, rollout["rollout_id"]) == {"client_gone": 1})

    # Control: the same call from a client that waits for the end is recorded, all of it sampled.
    before = gw.engine.sampled
    text = call_with_sdk(gw, rollout, api, stream=stream, timeout=30, max_tokens=20)
    assert text.split() == ["word"] * 20
    [call] = gw.store.list_calls(rollout["rollout_id"])
    assert len(call.response_token_ids) == 20 and gw.engine.sampled == before + 20
    assert dropped(gw, API_NAMES[api], "client_gone") == 1.0


def test_sdk_retries_after_timeouts_leave_no_dead_branches(make_gateway: Any) -> None:
    """An SDK that times out and retries (OpenAI's default: two retries) used to leave one recorded
    call per attempt, each with the same prompt: dead branches carrying the rollout's reward."""
    gw = make_gateway([ANSWER], token_delay_s=DELAY_S, counting=True)
    rollout = gw.rollout()
    with pytest.raises(openai.APITimeoutError):
        call_with_sdk(gw, rollout, "chat", stream=False, timeout=3, max_retries=2)  # each reaches the engine
    eventually(lambda: gw.engine.running == 0)
    assert gw.engine.started == 3  # three attempts reached the engine...
    assert gw.store.list_calls(rollout["rollout_id"]) == []  # ...and none was recorded
    assert dropped(gw, "chat.completions", "client_gone") == 3.0
    eventually(lambda: drops_in_store(gw, rollout["rollout_id"]) == {"client_gone": 3})


def raw_request(base_url: str, key: str, body: dict[str, Any]) -> tuple[socket.socket, bytes]:
    """A connected socket and one whole chat request for it."""
    host, port = base_url.removeprefix("http://").split("/")[0].split(":")
    path = "/" + base_url.removeprefix("http://").split("/", 1)[1] + "/chat/completions"
    raw = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    ).encode()
    return socket.create_connection((host, int(port)), timeout=30), head + raw


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("how", ["half_close", "close", "reset"])
def test_a_client_whose_socket_goes_cancels_its_call(make_gateway: Any, how: str, stream: bool) -> None:
    gw = make_gateway([ANSWER], token_delay_s=DELAY_S, counting=True)
    total = len(gw.engine.turn_token_ids(0))
    rollout = gw.rollout()
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": stream}
    sock, request = raw_request(rollout["base_url"], rollout["api_key"], body)
    sock.sendall(request)
    eventually(lambda: gw.engine.sampled >= 3, what="the generation to start")
    if how == "half_close":  # the whole request sent, then FIN: "I will send no more"
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):  # the gateway closes: a half-closed client is gone
            got += chunk
        assert b"[DONE]" not in got
        if not stream:
            assert got == b""  # no answer at all
    elif how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if how != "half_close":
        sock.close()
    eventually(lambda: gw.engine.running == 0, what="the generation to be cancelled")
    assert gw.engine.sampled < total // 2
    assert gw.store.list_calls(rollout["rollout_id"]) == []
    assert dropped(gw, "chat.completions", "client_gone") == 1.0
    if how == "half_close":
        sock.close()

    # Control: the same raw request from a client that reads its answer is recorded.
    body["max_tokens"] = 10
    sock2, request = raw_request(rollout["base_url"], rollout["api_key"], body)
    with sock2:
        sock2.sendall(request)
        got = b""
        while b"[DONE]" not in got and b'"finish_reason":"length"' not in got:
            got += sock2.recv(65536)
    eventually(lambda: len(gw.store.list_calls(rollout["rollout_id"])) == 1)


def test_calls_whose_clients_left_during_a_pause_are_never_generated(make_gateway: Any) -> None:
    gw = make_gateway([ANSWER], token_delay_s=DELAY_S, counting=True, keepalive_s=60)
    rollout, other = gw.rollout(), gw.rollout()
    gw.client.pause()
    # Non-streaming, and streaming (keep-alive comments only every 60 s: the read timeout fires).
    with pytest.raises(openai.APITimeoutError):
        call_with_sdk(gw, rollout, "chat", stream=False, timeout=0.5, max_retries=1)
    # (The stream's 200 is sent before the gate: the SDK's iterator raises its HTTP client's timeout.)
    with pytest.raises(Exception, match="timed out"):
        call_with_sdk(gw, rollout, "messages", stream=True, timeout=0.5)
    eventually(lambda: gw.client.state()["waiting"] == 0, what="the gone calls to leave the gate")
    # Control: a call whose client waits is still held, and generated at resume.
    answers: list[str] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call_with_sdk(gw, other, "chat", stream=False, timeout=30, max_tokens=5)
        )
    )
    waiter.start()
    eventually(lambda: gw.client.state()["waiting"] == 1)
    gw.client.resume()
    waiter.join(timeout=30)
    assert answers == ["word word word word word"]
    assert gw.engine.started == 1  # only the waiting client's call reached the engine
    assert gw.store.list_calls(rollout["rollout_id"]) == []
    assert len(gw.store.list_calls(other["rollout_id"])) == 1
    assert dropped(gw, "chat.completions", "client_gone") == 2.0  # the call and its retry
    assert dropped(gw, "messages", "client_gone") == 1.0
    eventually(lambda: drops_in_store(gw, rollout["rollout_id"]) == {"client_gone": 3})


# -- the rollout ends -------------------------------------------------------------------------------


def answer_in_thread(
    rollout: dict[str, Any], stream: bool, max_tokens: int | None = None
) -> tuple[threading.Thread, dict[str, Any]]:
    """Call chat in a thread with httpx (no retries); the result: status and body text."""
    result: dict[str, Any] = {}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "go"}],
        "stream": stream,
        "max_tokens": max_tokens,
    }

    def run() -> None:
        r = httpx.post(
            f"{rollout['base_url']}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {rollout['api_key']}"},
            timeout=60,
        )
        result.update(status=r.status_code, text=r.text)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("ending", ["finish_api", "cancel_api", "finish_in_process", "finish_elsewhere"])
def test_a_rollout_that_ends_records_none_of_its_calls_in_flight(
    make_gateway: Any, tmp_path: Any, ending: str, stream: bool
) -> None:
    gw = make_gateway([ANSWER], token_delay_s=DELAY_S, counting=True)
    total = len(gw.engine.turn_token_ids(0))
    ended, kept = gw.rollout(), gw.rollout()
    # Ended elsewhere (another process), the gateway hears nothing: the call runs to its end (kept
    # short) and the store refuses it.
    budget = 40 if ending == "finish_elsewhere" else None
    thread, result = answer_in_thread(ended, stream, budget)
    control, control_result = answer_in_thread(kept, stream, 30)
    eventually(lambda: gw.engine.sampled >= 10, what="both generations to be under way")
    rid = ended["rollout_id"]
    if ending == "finish_api":
        gw.client.finish_rollout(rid, "success", 1.0)
    elif ending == "cancel_api":
        gw.client.cancel_rollout(rid)
    elif ending == "finish_in_process":  # a controller sharing the gateway's store object
        gw.store.finish_rollout(rid, Outcome.SUCCESS, 1.0)
    else:
        other = SQLiteStore(gw.store.path)
        other.finish_rollout(rid, Outcome.SUCCESS, 1.0)
        other.close()
    thread.join(timeout=60)
    control.join(timeout=60)
    if stream:  # the 200 went out first: the stream ends with the error event, once
        assert result["status"] == 200 and result["text"].count('"code": "rollout_closed"') == 1
        assert "[DONE]" not in result["text"]
    else:
        assert result["status"] == 409 and json.loads(result["text"])["error"]["code"] == "rollout_closed"
    eventually(lambda: gw.engine.running == 0)
    if ending != "finish_elsewhere":  # heard of: cancelled at the engine
        assert gw.engine.sampled < total // 2
    assert gw.store.list_calls(rid) == []
    assert dropped(gw, "chat.completions", "rollout_ended") == 1.0
    eventually(lambda: drops_in_store(gw, rid) == {"rollout_ended": 1})
    # Control: the other rollout's call, in flight all along, was answered and recorded.
    assert control_result["status"] == 200
    assert len(gw.store.list_calls(kept["rollout_id"])) == 1


def test_the_trainer_trains_on_exactly_the_calls_the_evaluator_saw(make_gateway: Any) -> None:
    """The controller reads a rollout's calls for its evaluator and audit, then finishes it. A call
    committed between the two (its harness died with it in flight) was judged by nobody: with the
    finisher's ``calls_seen`` the samples leave it out; a call after the finish cannot be recorded."""
    from harnessrl.trajectory import build_rollout_samples

    gw = make_gateway(["one", "two", "three", "four"])
    rollout = gw.rollout()
    rid = rollout["rollout_id"]
    for _ in range(2):
        call_with_sdk(gw, rollout, "chat", stream=False, timeout=30)
    seen = gw.client.list_calls(rid)  # what the evaluator and the audit read
    call_with_sdk(gw, rollout, "chat", stream=False, timeout=30)  # committed after that read
    gw.client.finish_rollout(rid, "success", 1.0, metadata={"calls_seen": len(seen)})
    with pytest.raises(openai.ConflictError):  # and nothing after the finish
        call_with_sdk(gw, rollout, "chat", stream=False, timeout=30)
    ended = gw.store.get_rollout(rid)
    recorded = gw.store.list_calls(rid)
    assert len(recorded) == 3
    built = build_rollout_samples(ended, recorded)
    trained = {span.call_seq for sample in built.samples for span in sample.spans}
    assert trained == {c.seq for c in seen} and built.calls_unseen == 1
    # Control: the same calls without the finisher's count would all be trained on.
    silent = ended.model_copy(update={"metadata": {}})
    assert {s.call_seq for x in build_rollout_samples(silent, recorded).samples for s in x.spans} == {0, 1, 2}
