"""The lapse fence covers a call from its admission, not from the start of its generation.

A gateway whose lease lapses is not waited for by a pause elsewhere (``gateway.control.heartbeat``):
a call it was working on across the lapse must not be recorded (the weights may have changed under
it). The fence used to be taken when the generation started, so a lapse after the call was admitted
— while its rollout was read back after the gate reopened, or its prompt built — and a renewal
before the generation started went unseen, and the call was recorded.

A real gateway (``shared_store``: other processes use its SQLite file) with a store whose rollout
read after the gate is held; the lapse is the heartbeat's own counter moving on meanwhile (a stall
past the lease and a renewal, as ``test_gate_processes`` makes with SIGSTOP across processes).
"""

from __future__ import annotations

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

from .conftest import ADMIN_KEY

PATIENCE_S = 60  # only ends a hung test: every wait below is for a state


class HeldRolloutRead(SQLiteStore):
    """A real store whose ``get_rollout`` waits for ``go`` once ``hold`` is set (then only once)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.go = threading.Event()

    def get_rollout(self, rollout_id: str) -> Any:
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            assert self.go.wait(PATIENCE_S), "the test never let the read go"
        return super().get_rollout(rollout_id)


def wait_for(predicate, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def held_call(tmp_path: Path, tokenizer: PolicyTokenizer, *, lapse: bool) -> tuple[int, int]:
    """A call held at a paused gate, let through, and (``lapse``) the gateway's lease lapsing and
    renewed while its rollout is read back. Returns its status and how many calls were recorded."""
    store = HeldRolloutRead(tmp_path / "store.db")
    engine = ScriptedEngine(["Hello!"], tokenizer)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine, shared_store=True)
    state = app.state.gateway
    try:
        with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY) as client:
            rollout = client.create_rollout({"prompt": "test"})
            assert client.pause(timeout=PATIENCE_S)["drained"]
            answers: list[httpx.Response] = []
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            calling = threading.Thread(
                target=lambda: answers.append(
                    httpx.post(
                        f"{rollout['base_url']}/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {rollout['api_key']}"},
                        timeout=PATIENCE_S,
                    )
                )
            )
            calling.start()
            wait_for(lambda: state.gate.waiting == 1, "the call to wait at the gate")
            store.hold.set()
            client.resume()
            assert store.entered.wait(PATIENCE_S), "the call never read its rollout back"
            if lapse:
                state.cluster.heartbeat.lapses += 1  # lapsed, then renewed: the lease is live again
            store.go.set()
            calling.join(PATIENCE_S)
            assert answers, "the call never ended"
            return answers[0].status_code, len(client.list_calls(rollout["rollout_id"]))
    finally:
        store.close()


def test_a_lease_lapsing_after_the_call_was_admitted_drops_the_call(tmp_path, tokenizer) -> None:
    status, recorded = held_call(tmp_path, tokenizer, lapse=True)
    assert (status, recorded) == (502, 0)


def test_control_the_same_call_without_a_lapse_is_answered_and_recorded(tmp_path, tokenizer) -> None:
    status, recorded = held_call(tmp_path, tokenizer, lapse=False)
    assert (status, recorded) == (200, 1)
