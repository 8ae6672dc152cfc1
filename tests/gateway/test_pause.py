"""Pause holds new model calls (no error, streaming clients get keep-alives) and drains in-flight ones."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from harnessrl.gateway.control.pause import PauseGate
from harnessrl.store.sqlite import SQLiteStore

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_gate_admits_in_order_and_drains() -> None:
    async def main() -> None:
        gate = PauseGate()
        first = gate.join()
        assert first.admitted and gate.in_flight == 1
        pausing = asyncio.create_task(gate.pause(timeout=5))
        await asyncio.sleep(0)
        waiting = [gate.join() for _ in range(3)]
        assert not any(t.admitted for t in waiting) and gate.waiting == 3
        assert not pausing.done()
        first.release()
        assert await pausing is True  # drained once the in-flight call ended
        order: list[int] = []

        async def wait(i: int) -> None:
            await waiting[i].wait()
            order.append(i)

        tasks = [asyncio.create_task(wait(i)) for i in (2, 0)]
        await asyncio.sleep(0)
        waiting[1].release()  # a client gave up while waiting
        assert gate.resume() == 2
        await asyncio.gather(*tasks)
        assert sorted(order) == [0, 2] and gate.in_flight == 2
        assert await gate.pause(timeout=0.01) is False  # two still in flight
        for t in waiting:
            t.release()
        assert gate.in_flight == 0

    asyncio.run(main())


def test_call_made_while_paused_waits_and_completes_after_resume(make_gateway: Any) -> None:
    gw = make_gateway(["after the pause"])
    rollout = gw.rollout()
    paused = gw.client.pause(timeout=5)
    assert paused["paused"] is True and paused["drained"] is True and paused["in_flight"] == 0
    result: dict[str, Any] = {}

    def call() -> None:
        client = openai.OpenAI(
            base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0, timeout=30
        )
        result["text"] = client.chat.completions.create(**CHAT).choices[0].message.content

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["waiting"] != 1:
        assert time.monotonic() < deadline, "the call never reached the gate"
        time.sleep(0.02)
    # Held at the gate (the state says so): not answered, nothing recorded.
    assert "text" not in result and gw.client.list_calls(rollout["rollout_id"]) == []
    assert gw.client.resume()["released"] == 1
    thread.join(timeout=10)
    assert result["text"] == "after the pause"


def test_pause_returns_only_after_in_flight_calls_finish(make_gateway: Any) -> None:
    # Calls of several seconds each: all three must still be in flight when the pause is asked for,
    # even on a loaded machine (at 0.02 s a token they lived ~1.4 s).
    gw = make_gateway(["a slow answer " * 10], token_delay_s=0.1)
    rollouts = [gw.rollout() for _ in range(3)]
    done: list[float] = []

    def call(rollout: dict[str, Any]) -> None:
        client = openai.OpenAI(
            base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0, timeout=120
        )
        client.chat.completions.create(**CHAT)
        done.append(time.monotonic())

    threads = [threading.Thread(target=call, args=(r,)) for r in rollouts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["in_flight"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    paused = gw.client.pause(timeout=60)
    assert paused["drained"] is True and paused["in_flight"] == 0
    # Drained means finished and recorded: every call is in the store the moment pause returns.
    assert all(len(gw.client.list_calls(r["rollout_id"])) == 1 for r in rollouts)
    for t in threads:
        t.join(timeout=60)
    assert len(done) == 3
    gw.client.resume()


def test_pause_timeout_reports_not_drained(make_gateway: Any) -> None:
    gw = make_gateway(["slow " * 20], token_delay_s=0.15)  # a call of several seconds
    rollout = gw.rollout()
    thread = threading.Thread(
        target=lambda: httpx.post(
            f"{rollout['base_url']}/chat/completions",
            json=CHAT,
            headers={"x-api-key": rollout["api_key"]},
            timeout=120,
        )
    )
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["in_flight"] < 1:
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.01)
    paused = gw.client.pause(timeout=0.1)
    assert paused["drained"] is False and paused["in_flight"] == 1
    gw.client.resume()
    thread.join(timeout=120)


@pytest.mark.timeout(60)
def test_streaming_call_gets_keepalives_while_paused(
    make_gateway: Any,
) -> None:
    gw = make_gateway(["streamed after resume"], keepalive_s=0.1)
    rollout = gw.rollout()
    gw.client.pause(timeout=1)
    lines: list[str] = []

    def stream() -> None:
        with httpx.stream(
            "POST",
            f"{rollout['base_url']}/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-api-key": rollout["api_key"]},
            timeout=30,
        ) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 60  # a wait, not a timing
    while not any(line.startswith(":") for line in lines):
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)
    gw.client.resume()
    thread.join(timeout=10)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == "streamed after resume"


def test_resume_with_a_bad_policy_version_is_a_400_naming_it(make_gateway: Any) -> None:
    from harnessrl.errors import BadRequest

    gw = make_gateway(["x"])
    gw.client.pause(timeout=5)
    for bad in ("abc", -1):
        with pytest.raises(BadRequest, match="policy_version"):
            gw.client.resume(policy_version=bad)  # type: ignore[arg-type]
    assert gw.client.state()["paused"] is True
    assert gw.client.resume(policy_version=3)["paused"] is False


def test_a_pause_committed_by_another_process_is_read_on_the_event_loop(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a SQLite file the gateway polls the gate (no notifications); ``reads_at_once`` lets it read
    on its event loop, with no hop to a worker thread 20 times a second. A command committed by
    another store on the file (the trainer's) still reaches it. The control turns ``reads_at_once``
    off: the reads move to anyio's worker threads, which the probe sees."""
    readers: list[str] = []
    read_gate = SQLiteStore.read_gate

    def recording(self: SQLiteStore) -> Any:
        readers.append(threading.current_thread().name)
        return read_gate(self)

    monkeypatch.setattr(SQLiteStore, "read_gate", recording)
    gw = make_gateway()
    other = SQLiteStore(gw.store.path)  # another process's store, as far as SQLite knows

    def until(paused: bool) -> None:
        deadline = time.monotonic() + 20
        while gw.client.health()["paused"] is not paused:
            assert time.monotonic() < deadline, f"the gateway never saw paused={paused}"
            time.sleep(0.01)

    try:
        other.command_gate(paused=True)
        until(True)
        assert readers and not [name for name in readers if name.startswith("AnyIO worker")]
        readers.clear()
        monkeypatch.setattr(SQLiteStore, "reads_at_once", property(lambda self: False))
        other.command_gate(paused=False)
        until(False)
        assert any(name.startswith("AnyIO worker") for name in readers)  # control
    finally:
        other.close()


def _held_call(rollout: dict[str, Any], *, stream: bool, out: dict[str, Any]) -> threading.Thread:
    """A second chat call of ``rollout`` in a thread, as a harness makes it; what it got in ``out``:
    ``status`` and ``text`` (a stream's ``lines``)."""

    def call() -> None:
        with httpx.stream(
            "POST",
            f"{rollout['base_url']}/chat/completions",
            json={**CHAT, "stream": stream},
            headers={"x-api-key": rollout["api_key"]},
            timeout=30,
        ) as r:
            out["status"] = r.status_code
            out["text"] = r.read().decode()

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def _until_waiting(gw: Any, n: int) -> None:
    deadline = time.monotonic() + 60  # a wait, not a timing
    while gw.client.state()["waiting"] != n:
        assert time.monotonic() < deadline, "the call never reached the gate"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_held_while_another_process_requeues_its_rollout_is_refused_and_starts_nothing(
    make_gateway: Any, stream: bool
) -> None:
    """Another process (the controller, a restarted trainer: its own store object, so this gateway
    hears of no end) requeues a rollout while one of its calls waits at the paused gate. The call
    belongs to the attempt that ended: after the resume it is refused with 409 ``rollout_closed``,
    never recorded, counted as dropped; and the requeued rollout stays queued for a worker to claim.
    It was answered and recorded under the new attempt, which it had started with no worker on it."""
    gw = make_gateway(["first", "second"])
    rollout = gw.rollout()
    rid = rollout["rollout_id"]
    first = httpx.post(
        f"{rollout['base_url']}/chat/completions", json=CHAT, headers={"x-api-key": rollout["api_key"]}
    )
    assert first.status_code == 200
    gw.client.pause(timeout=5)
    out: dict[str, Any] = {}
    thread = _held_call(rollout, stream=stream, out=out)
    _until_waiting(gw, 1)
    other = SQLiteStore(gw.store.path)  # another process's store, as far as SQLite knows
    try:
        requeued = other.requeue_rollout(rid, error="infra")
    finally:
        other.close()
    gw.client.resume()
    thread.join(timeout=20)
    if stream:
        assert out["status"] == 200  # sent before the gate: the refusal is the stream's last event
        error = json.loads(out["text"].rsplit("data: ", 1)[1])["error"]
        assert "[DONE]" not in out["text"]
    else:
        assert out["status"] == 409, out["text"]
        error = json.loads(out["text"])["error"]
    assert error["code"] == "rollout_closed" and "queued again (attempt 1)" in error["message"]
    after = gw.store.get_rollout(rid)
    assert (after.status.value, after.attempt, after.worker_id) == ("queued", 1, None)
    assert after.api_key == requeued.api_key
    assert [(c.seq, c.attempt) for c in gw.store.list_calls(rid)] == [(0, 0)]
    deadline = time.monotonic() + 60
    while gw.store.get_rollout(rid).metadata.get("dropped_calls") != {"rollout_ended": 1}:
        assert time.monotonic() < deadline, gw.store.get_rollout(rid).metadata
        time.sleep(0.02)


def test_a_call_held_while_its_rollout_goes_on_is_answered(make_gateway: Any) -> None:
    """Control for the test above: nothing happened to the rollout during the pause, so the held
    call is answered and recorded under the same attempt after the resume."""
    gw = make_gateway(["first", "second"])
    rollout = gw.rollout()
    rid = rollout["rollout_id"]
    httpx.post(
        f"{rollout['base_url']}/chat/completions", json=CHAT, headers={"x-api-key": rollout["api_key"]}
    )
    gw.client.pause(timeout=5)
    out: dict[str, Any] = {}
    thread = _held_call(rollout, stream=False, out=out)
    _until_waiting(gw, 1)
    gw.client.resume()
    thread.join(timeout=20)
    assert out["status"] == 200 and json.loads(out["text"])["choices"][0]["message"]["content"] == "second"
    assert [(c.seq, c.attempt) for c in gw.store.list_calls(rid)] == [(0, 0), (1, 0)]
    assert gw.store.get_rollout(rid).status.value == "running"
