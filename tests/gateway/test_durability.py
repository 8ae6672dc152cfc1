"""Crash safety: every call a client got a 200 for is in the store after a SIGKILL, in order; and a
client that disconnects mid-stream cancels its generation and leaves no record."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient

ADMIN_KEY = "durability-admin"


def start_gateway(script: Path, store: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harnessrl.gateway",
            "--model",
            f"scripted:{script}",
            "--port",
            "0",
            "--store",
            str(store),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            url = match.group(1)
            break
        assert time.monotonic() < deadline, "gateway did not start"
    else:
        raise AssertionError(f"gateway exited with {proc.wait()}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining the log
    GatewayClient(url, ADMIN_KEY).wait_ready(timeout=30)
    return proc, url


@pytest.mark.timeout(120)
def test_sigkill_loses_no_answered_call(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["A reply that takes a little while to stream. " * 20]}))
    store = tmp_path / "store.db"
    proc, url = start_gateway(script, store)
    admin = GatewayClient(url, ADMIN_KEY)
    rollouts = [admin.create_rollout({"i": i}) for i in range(6)]
    answered: dict[str, list[tuple[int, str]]] = {r["rollout_id"]: [] for r in rollouts}
    cut_off: list[str] = []

    def harness(rollout: dict[str, Any]) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        with httpx.Client(headers={"Authorization": f"Bearer {rollout['api_key']}"}, timeout=30) as http:
            while True:
                try:
                    r = http.post(
                        f"{rollout['base_url']}/chat/completions", json={"model": "m", "messages": messages}
                    )
                except httpx.HTTPError as exc:
                    cut_off.append(type(exc).__name__)  # the gateway died under us
                    return
                if r.status_code != 200:
                    return
                content = r.json()["choices"][0]["message"]["content"]
                answered[rollout["rollout_id"]].append((int(r.headers["x-harnessrl-call-seq"]), content))
                messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "more"}]

    threads = [threading.Thread(target=harness, args=(r,)) for r in rollouts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(len(v) for v in answered.values()) < 30:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    for t in threads:
        t.join(timeout=30)
    # Requests that were in flight at the kill see the connection drop (not a refused connect).
    assert any(name != "ConnectError" for name in cut_off), cut_off

    proc, url = start_gateway(script, store)
    try:
        admin = GatewayClient(url, ADMIN_KEY)
        for rollout in rollouts:
            rid = rollout["rollout_id"]
            calls = admin.list_calls(rid)
            got = answered[rid]
            assert [c.seq for c in calls] == list(range(len(calls)))  # dense, in order
            assert len(calls) >= len(got)  # at most one more: answered by the store, cut before the client
            assert [(c.seq, c.response["content"]) for c in calls[: len(got)]] == got
            for prev, nxt in zip(calls, calls[1:], strict=False):
                head = prev.prompt_token_ids + prev.response_token_ids
                assert nxt.prompt_token_ids[: len(head)] == head
        # After the restart, reuse memory is rebuilt from the store: the next call still extends.
        rollout = rollouts[0]
        calls = admin.list_calls(rollout["rollout_id"])
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for c in calls:
            messages += [
                {"role": "assistant", "content": c.response["content"]},
                {"role": "user", "content": "more"},
            ]
        r = httpx.post(
            f"{url}/rollouts/{rollout['rollout_id']}/v1/chat/completions",  # the new gateway's port
            json={"model": "m", "messages": messages},
            headers={"x-api-key": rollout["api_key"]},
        )
        assert r.status_code == 200
        last, new = admin.list_calls(rollout["rollout_id"])[-2:]
        assert new.prompt_token_ids[: len(last.prompt_token_ids) + len(last.response_token_ids)] == (
            last.prompt_token_ids + last.response_token_ids
        )
        assert 'harnessrl_prompt_reuse_total{result="reused"} 1.0' in admin.metrics()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_client_disconnect_mid_stream_cancels_and_is_not_recorded(make_gateway: Any) -> None:
    gw = make_gateway(["word " * 3000], token_delay_s=0.02)  # a minute of answer
    rollout = gw.rollout()
    with httpx.stream(
        "POST",
        f"{rollout['base_url']}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers={"x-api-key": rollout["api_key"]},
        timeout=30,
    ) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: {")
            if seen >= 5:
                break  # leaving the block closes the connection mid-answer
    deadline = time.monotonic() + 30  # the whole answer would take 60 s: it must have been cancelled
    while gw.client.state()["in_flight"]:
        assert time.monotonic() < deadline, "generation kept running after the client left"
        time.sleep(0.02)
    assert gw.client.list_calls(rollout["rollout_id"]) == []
    assert "harnessrl_client_disconnects_total 1.0" in gw.client.metrics()
    # The rollout carries on: a retry gets the same scripted turn (nothing was recorded).
    r = httpx.post(
        f"{rollout['base_url']}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
        headers={"x-api-key": rollout["api_key"]},
    )
    assert r.json()["choices"][0]["message"]["content"] == "word word word"
