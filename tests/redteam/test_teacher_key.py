"""Red team: the teacher's upstream key never reaches the sandbox (teacher mode, issue 42).

A real sandboxed rollout (``harnessrl rollout``, the bwrap sandbox, the real gateway in teacher mode)
whose harness is ``key_probe.py``: it searches its environment, ``/proc``, every file it can read and
every answer the gateway gives it (the three APIs, whole and streamed, upstream refusals that echo
the key, the other routes) for the key, a fresh random secret held in the ``harnessrl rollout``
process's environment only. The upstream is a small real server here that answers only when it is
sent that key. The control runs the same probe with the secret planted where each channel looks (the
harness's env, a file in its workspace, an upstream that puts the key in its answers): there the
probe must find it on every channel, so a miss in the real run means the key was not there.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harnessrl.gateway.server import serve_in_thread
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.store.sqlite import SQLiteStore

pytestmark = [
    pytest.mark.slow,  # two rollouts whose probe reads every file it can (~250k here): ~75 s each
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's cgroups need root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

PROBE = Path(__file__).with_name("key_probe.py")
KEY_ENV = "HRL_REDTEAM_TEACHER_KEY"
CHANNELS = ("env", "proc", "files", "relay")


def upstream(key: str, *, echo: bool) -> Starlette:
    """An OpenAI-compatible chat server that answers only ``Bearer key``; a request whose last
    message says FAIL is refused with an error echoing the Authorization it got (as careless
    providers do); ``echo``: its answers carry the key too (the control of the relay probe)."""
    seen: list[bool] = []

    def authorized(request: Request) -> bool:
        ok = request.headers.get("authorization") == f"Bearer {key}"
        seen.append(ok)
        return ok

    async def models(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"message": "no key"}}, status_code=401)
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": {"message": "no key"}}, status_code=401)
        body = await request.json()
        if "FAIL" in str(body["messages"][-1].get("content")):
            said = f"bad request from {request.headers['authorization']}"
            return JSONResponse(
                {"error": {"message": said, "type": "invalid_request_error"}}, status_code=400
            )
        text = f"Hello. {key}" if echo else "Hello."
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        head = {"id": "c", "created": 0, "model": "u"}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage})

        async def events() -> AsyncIterator[str]:
            for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [choice]})}\n\n"
            yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )
    app.state.seen = seen
    return app


def probe_rollout(tmp_path: Path, *, plant: bool) -> dict[str, Any]:
    """One sandboxed rollout of the probe against a teacher-mode gateway; its report and more."""
    key = f"sk-teacher-{secrets.token_urlsafe(24)}"
    up = upstream(key, echo=plant)
    run_dir = tmp_path / "run"
    (tmp_path / "script.json").write_text(json.dumps({"turns": [{"content": "(the policy: unused)"}]}))
    planted = ""
    if plant:  # the control: the secret where each channel looks
        planted = f'env = {{ PLANTED_SECRET = "{key}" }}\nfiles = {{ "notes/planted.txt" = "{key}" }}\n'
    task = {"prompt": "Find the teacher's key.", "key_reversed": key[::-1]}
    with serve_in_thread(up) as up_url:
        config = tmp_path / "probe.toml"
        config.write_text(
            f"""
[engine]
model = "scripted:{tmp_path / "script.json"}"

[engine.teacher]
base_url = "{up_url}/v1"
model = "u"
api_key_env = "{KEY_ENV}"

[harness]
preset = "python"
command = ["{PROBE}"]
timeout_s = 300
sandbox = "bwrap"
{planted}
[evaluator]
type = "command"
reward_from = "json"
command = ["python", "-I", "-c", "print('{{\\"reward\\": 0.0}}')"]

[controller]
max_infra_retries = 0
"""
        )
        proc = subprocess.run(
            [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config)]
            + ["--task", json.dumps(task), "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, KEY_ENV: key},
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    stdout = (Path(summary["log"]) / "stdout.log").read_text()
    lines = [line for line in stdout.splitlines() if line.startswith('{"key_probe"')]
    assert lines, f"the probe printed no report: {stdout[-2000:]}\n{proc.stderr[-2000:]}"
    store = SQLiteStore(run_dir / "harnessrl.db")
    calls = store.list_calls(summary["rollout_id"])
    store.close()
    # What the host side wrote for this run (store, logs, config copies): the key in none of it.
    on_host = [str(p) for p in run_dir.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    return {
        "report": json.loads(lines[0]),
        "calls": calls,
        "upstream_saw_key": sum(up.state.seen),
        "on_host": on_host,
        "stderr": proc.stderr,
        "key": key,
    }


def test_the_teacher_key_is_nowhere_the_sandboxed_harness_can_look(tmp_path: Path) -> None:
    run = probe_rollout(tmp_path, plant=False)
    report = run["report"]
    assert report["key_probe"] == {c: [] for c in CHANNELS}, report
    searched = report["searched"]
    assert searched["env"] > 5 and searched["proc"] > 0 and searched["files"] > 1000, searched
    assert report["answers"] >= 20
    # The key was in use all along: the upstream was sent it (the start probe and every call) and
    # answered; the calls it answered are recorded, the refused ones are not.
    assert run["upstream_saw_key"] >= 13
    assert (
        sorted(c.api for c in run["calls"]) == ["chat.completions"] * 2 + ["messages"] * 2 + ["responses"] * 2
    )
    assert run["on_host"] == [] and run["key"] not in run["stderr"]


def test_control_the_probe_finds_the_key_where_it_is_planted(tmp_path: Path) -> None:
    run = probe_rollout(tmp_path, plant=True)
    found = run["report"]["key_probe"]
    assert all(found[c] for c in CHANNELS), found
    assert "PLANTED_SECRET" in found["env"]
    assert any(p.endswith("/environ") for p in found["proc"])
    assert any(p.endswith("notes/planted.txt") for p in found["files"])
    assert any("/chat/completions" in w for w in found["relay"])
