"""With real vLLM (CPU): a client that leaves mid-generation stops the engine, and the store holds only
calls whose clients received their final event (issue 36).

vLLM samples the tiny model faster than a client here can be made to leave "mid-generation", so the
server is frozen with the call's request in it (``freeze_mid_generation``: ``/pause?mode=keep``),
the client's socket is closed, and only then is vLLM resumed. Tokens are counted by vLLM itself
(``vllm:generation_tokens_total``): after the client left, the request generates nothing more.
Control, in the same test: the same call whose client stays is generated to its budget after the
resume, and recorded.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from tests.vllm.vllm_support import (
    freeze_mid_generation,
    requests_finished,
    requests_running,
    resume_server,
    server_metric,
    stored_whole,
    wait_until,
)

#: A call long enough that the freeze usually finds it still generating although this process (the
#: gateway's thread beside the freeze's) lags behind vLLM. Measured with the calls greedy (below) on
#: this 2-core host at load 5-13: of 26 calls, the freeze landed 2-568 tokens into 24 (half under 10)
#: and 2 streamed ones at 1,024 ended first, and were sent again (``ATTEMPTS``). Not more: the control
#: call generates its whole budget, and at 3,600 (near the context; set when calls at temperature 1
#: often ended early on a sampled stop token, which greedy calls no longer do) the six cases took
#: 8 min of the vLLM group here, at 1,024 under 2.
BUDGET = 1024
#: Tokens vLLM may still sample for a request after its client left: the steps already scheduled
#: when the abort arrives (one token per step for one request).
STEPS_IN_FLIGHT = 8
#: Calls sent until one is caught generating: a call that ends before the freeze says nothing and
#: costs its budget, so a short budget with room for a few such calls (2 in 14 at 1,024 in the worst
#: run above: all 6 ending first, about one in 100,000) is cheaper than a budget none could outrun.
#: The calls are greedy: the random tiny model's greedy answer to this prompt cycles through four
#: tokens, none a stop token, so a call runs its whole budget (at temperature 1 it sampled a stop
#: token within the budget now and then: a messages call ended so in a CI run, and two calls in three
#: did in a measurement of 24).
ATTEMPTS = 6


def request_bytes(gateway: Any, rollout: dict[str, Any], api: str, stream: bool) -> bytes:
    prompt = "Tell me a very long story about a lighthouse keeper."
    headers = [f"Authorization: Bearer {rollout['api_key']}"]
    if api == "chat":
        path = f"/rollouts/{rollout['rollout_id']}/v1/chat/completions"
        body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": BUDGET}
    elif api == "responses":
        path = f"/rollouts/{rollout['rollout_id']}/v1/responses"
        body = {"model": "tiny", "input": prompt, "max_output_tokens": BUDGET}
    else:
        path = f"/rollouts/{rollout['rollout_id']}/v1/messages"
        headers = [f"x-api-key: {rollout['api_key']}", "anthropic-version: 2023-06-01"]
        body = {"model": "tiny", "max_tokens": BUDGET, "messages": [{"role": "user", "content": prompt}]}
    raw = json.dumps({**body, "temperature": 0.0, "stream": stream}).encode()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    head += [f"Content-Length: {len(raw)}", "Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + raw


def dropped(gateway: Any) -> float:
    for row in gateway.client.metrics().splitlines():
        if row.startswith("harnessrl_calls_dropped_total{") and 'reason="client_gone"' in row:
            return float(row.rsplit(" ", 1)[1])
    return 0.0


def generated(url: str) -> float:
    return server_metric(url, "vllm:generation_tokens_total")


def frozen_call(
    gateway: Any, url: str, api: str, stream: bool
) -> tuple[dict[str, Any], socket.socket, float]:
    """Send a call and freeze vLLM while it generates; returns its rollout, its socket and vLLM's
    finished-requests count from before it was sent."""
    host, port = gateway.url.removeprefix("http://").split(":")
    for _ in range(ATTEMPTS):
        rollout = gateway.rollout()
        finished = requests_finished(url)
        sock = socket.create_connection((host, int(port)), timeout=300)
        sock.sendall(request_bytes(gateway, rollout, api, stream))
        if freeze_mid_generation(url, 1, finished) == 1:
            return rollout, sock, finished
        # The call ended before the freeze (this process lagged behind vLLM by its whole budget):
        # it says nothing either way. Let it go and send another.
        resume_server(url)
        while sock.recv(65536):
            pass
        sock.close()
    pytest.fail(f"every one of {ATTEMPTS} calls ended before vLLM was frozen")


def call_after_freeze(
    gateway: Any, url: str, api: str, stream: bool, leaves: bool
) -> tuple[float, list[Any]]:
    """One frozen call whose client leaves (or stays) before vLLM resumes: the tokens vLLM generated
    after the freeze and the calls the store holds for its rollout."""
    rollout, sock, finished = frozen_call(gateway, url, api, stream)
    try:
        at_freeze = generated(url)
        if leaves:
            sock.close()
            wait_until(lambda: dropped(gateway) == 1.0, "the gateway to drop the call")
    finally:
        resume_server(url)
    if leaves:  # an aborted request is not counted finished by vLLM: it leaves the running ones
        wait_until(lambda: requests_running(url) == 0, "vLLM to abort it")
    else:
        got = b""
        while chunk := sock.recv(65536):  # the whole answer, to the gateway's close
            got += chunk
        sock.close()
        assert got.startswith(b"HTTP/1.1 200 ")
        wait_until(lambda n=finished: requests_finished(url) > n, "vLLM to finish it")
    return generated(url) - at_freeze, gateway.store.list_calls(rollout["rollout_id"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_client_that_leaves_stops_vllm_and_leaves_no_record(
    gateway: Any, tiny_server: Any, api: str, stream: bool
) -> None:
    url = tiny_server.url
    after_leaving, calls = call_after_freeze(gateway, url, api, stream, leaves=True)
    assert after_leaving <= STEPS_IN_FLIGHT  # vLLM stopped generating for the client that left
    assert calls == []  # and nothing was recorded

    stop_ids = gateway.engine.tokenizer.stop_token_ids
    for _ in range(ATTEMPTS):  # control: the same call whose client stays
        after_staying, calls = call_after_freeze(gateway, url, api, stream, leaves=False)
        [call] = calls  # the client that stayed got its whole answer, recorded...
        assert stored_whole(call, stop_ids, BUDGET)
        if after_staying > STEPS_IN_FLIGHT:  # ...generated after the resume: the count would show it
            return
        # The call stopped within a few steps of the resume (at temperature 1 a CI run saw it after 8;
        # greedy, it runs its whole budget): it would have stopped there whether or not a client
        # left, so send another.
        assert call.finish_reason == "stop"
    pytest.fail(f"every one of {ATTEMPTS} control calls stopped on its own right after the resume")
