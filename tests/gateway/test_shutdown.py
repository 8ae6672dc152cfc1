"""A gateway stopping while paused answers the calls held at its gate at once, and lets the calls
already generating finish.

uvicorn's graceful shutdown waits for every request to end (30 s under ``run_gateway``) before the
app's lifespan shutdown runs; a call held at a paused gate waited all of it and then got a 500 or a
cut connection. Now the moment the shutdown starts (``transport.serving.GatewayServer``), a held
call gets a 503 ``gateway_stopping`` (an error event in a stream, whose 200 was sent), is counted as
dropped and nothing is recorded; a call that was generating is answered and recorded as before.

Real gateways on 127.0.0.1: ``serve_in_thread`` (stopped as its ``should_exit`` is set, as uvicorn's
signal handler sets it) and ``python -m harnessrl.gateway`` stopped by a real SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "shutdown-admin"
ROOT = Path(__file__).resolve().parents[2]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _call(rollout: dict[str, Any], *, stream: bool, out: dict[str, Any]) -> threading.Thread:
    """A chat call in a thread; ``out``: its ``status`` and body ``text``, or the ``error`` it met."""

    def call() -> None:
        try:
            with httpx.stream(
                "POST",
                f"{rollout['base_url']}/chat/completions",
                json={**CHAT, "stream": stream},
                headers={"x-api-key": rollout["api_key"]},
                timeout=60,
            ) as r:
                out["status"] = r.status_code
                out["text"] = r.read().decode()
        except httpx.HTTPError as exc:
            out["error"] = repr(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _stopping_error(out: dict[str, Any], *, stream: bool) -> dict[str, Any]:
    """The 503 ``gateway_stopping`` a held call got (the error event of a stream)."""
    assert "error" not in out, out
    if stream:
        assert out["status"] == 200 and "[DONE]" not in out["text"]
        return json.loads(out["text"].rsplit("data: ", 1)[1])["error"]
    assert out["status"] == 503, out
    return json.loads(out["text"])["error"]


def test_stopping_while_paused_answers_held_calls_at_once_and_finishes_generating_ones(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    store = SQLiteStore(tmp_path / "gw.db")
    # A long answer, slowly: still generating when the shutdown starts (the control).
    engine = ScriptedEngine(["word " * 60], tokenizer, token_delay_s=0.05)
    app = create_app(GatewayConfig(admin_key=ADMIN), store, engine)
    serving = serve_in_thread(app)
    url = serving.__enter__()
    try:
        admin = GatewayClient(url, ADMIN)
        generating, *held = (admin.create_rollout({"prompt": "x"}) for _ in range(3))
        outs: list[dict[str, Any]] = [{}, {}, {}]
        threads = [_call(generating, stream=True, out=outs[0])]
        _until(lambda: admin.state()["in_flight"] == 1, "the first call never started generating")
        assert admin.pause(timeout=0.05)["drained"] is False  # the gate closes; that call goes on
        threads += [_call(r, stream=s, out=o) for r, s, o in zip(held, (False, True), outs[1:], strict=True)]
        _until(lambda: admin.state()["waiting"] == 2, "the calls never reached the gate")
        admin.close()
    finally:
        serving.__exit__(None, None, None)  # should_exit, as uvicorn's SIGTERM handler sets it
    for thread in threads:
        thread.join(timeout=60)
    try:
        for out, stream in zip(outs[1:], (False, True), strict=True):
            error = _stopping_error(out, stream=stream)
            assert (error["type"], error["code"]) == ("api_error", "gateway_stopping")
        for rollout in held:
            assert store.list_calls(rollout["rollout_id"]) == []
            dropped = store.get_rollout(rollout["rollout_id"]).metadata.get("dropped_calls")
            assert dropped == {"gateway_stopping": 1}
        # Control: the call generating when the shutdown began was answered whole and recorded.
        assert outs[0]["status"] == 200 and outs[0]["text"].rstrip().endswith("data: [DONE]")
        [call] = store.list_calls(generating["rollout_id"])
        assert call.response["content"].split() == ["word"] * 60
    finally:
        store.close()


def test_sigterm_while_paused_answers_the_held_call_at_once(tmp_path: Path) -> None:
    """``harnessrl gateway`` as users start it (``run_gateway``, uvicorn's own signal handlers), a
    call held at its paused gate, a real SIGTERM: the call gets its 503 from the stopping gateway
    (it waited out the 30 s graceful timeout, then was cut), and the process exits 0."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": ["hello"]}))
    store = tmp_path / "gw.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.gateway", "--port", "0", "--model", f"scripted:{script}"]
        + ["--store", str(store)],
        cwd=ROOT,
        env={**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "listening on" in line:
                url = line.split("listening on ", 1)[1].split()[0]
                break
        else:
            raise AssertionError(f"the gateway exited with {proc.wait()} before listening")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep the pipe drained
        admin = GatewayClient(url, ADMIN)
        admin.wait_ready(timeout=60)
        rollout = admin.create_rollout({"prompt": "x"})
        admin.pause(timeout=5)
        out: dict[str, Any] = {}
        thread = _call(rollout, stream=False, out=out)
        _until(lambda: admin.state()["waiting"] == 1, "the call never reached the gate")
        admin.close()
        proc.send_signal(signal.SIGTERM)
        thread.join(timeout=60)
        error = _stopping_error(out, stream=False)
        assert error["code"] == "gateway_stopping"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with SQLiteStore(store) as db:
        assert db.list_calls(rollout["rollout_id"]) == []
        assert db.get_rollout(rollout["rollout_id"]).metadata.get("dropped_calls") == {"gateway_stopping": 1}
