"""Teacher mode passes a chat body on to its upstream and records the upstream's answer as it came,
so its store can hold what the policy path would never record: ``chat_template_kwargs`` that is not
an object (the policy path answers 400; the teacher's upstream may ignore it) and reasoning that is
not text (a provider's own object). ``harnessrl sft`` and its export ended in a traceback
(``AttributeError``) on either, whatever else the store held; each is now counted and skipped
(``unreadable_request``, ``no_answer``) and the rest trains. A real teacher gateway on a small real
upstream records the rollout; the harness is httpx; sft runs through its CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from tests.sft.test_cli import write_config
from typer.testing import CliRunner

from harnessrl.cli.main import app
from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.gateway.teacher import Teacher
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "teacher-records-admin"


def upstream() -> Starlette:
    """A chat upstream answering "It is 42."; with reasoning as an object when asked "odd".""" ""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "u", "object": "model"}]})

    async def chat(request: Request) -> Response:
        body = await request.json()
        message: dict[str, Any] = {"role": "assistant", "content": "It is 42."}
        if "odd" in body["messages"][-1]["content"]:
            message["reasoning"] = {"summary": "six sevens"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return JSONResponse({"id": "c1", "object": "chat.completion", "choices": [choice]})

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])]
    )


def record_teacher(run_dir: Path, tokenizer: PolicyTokenizer, bodies: list[dict[str, Any]]) -> None:
    """One rollout, one call per body (each a fresh question), finished with reward 1."""
    run_dir.mkdir(parents=True)
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        with serve_in_thread(upstream()) as up_url:
            teacher = Teacher(f"{up_url}/v1", "u", None)
            engine = ScriptedEngine(["unused"], tokenizer)
            gateway = create_app(GatewayConfig(admin_key=ADMIN), store, engine, teacher=teacher)
            with serve_in_thread(gateway) as url, GatewayClient(url, ADMIN) as client:
                created = client.create_rollout({"prompt": "x"}, run_id="teacher", task_id="t")
                headers = {"Authorization": f"Bearer {created['api_key']}"}
                for body in bodies:
                    reply = httpx.post(
                        created["base_url"] + "/chat/completions",
                        json={"model": "m", **body},
                        headers=headers,
                        timeout=30,
                    )
                    assert reply.status_code == 200, reply.text
        assert len(store.list_calls(created["rollout_id"])) == len(bodies)
        store.finish_rollout(created["rollout_id"], Outcome.SUCCESS, 1.0)
    finally:
        store.close()


def test_odd_teacher_records_are_skipped_and_the_rest_trains(tmp_path, tokenizer):
    ask = [{"role": "user", "content": "What is 6 x 7?"}]
    record_teacher(
        tmp_path / "teacher",
        tokenizer,
        [
            {"messages": ask, "chat_template_kwargs": "on"},
            {"messages": [{"role": "user", "content": "What is 6 x 7? (odd)"}]},
            {"messages": ask},  # control: an ordinary call trains
        ],
    )
    config = write_config(tmp_path, tmp_path / "teacher")
    runner = CliRunner()
    result = runner.invoke(app, ["sft", str(config)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "runs" / "student" / "sft_data.json").read_text())
    assert data["calls_skipped"] == {"unreadable_request": 1, "no_answer": 1}, data
    assert data["calls_rendered"] == 1 and data["sequences"] == 1
    out = tmp_path / "teacher.jsonl"
    result = runner.invoke(app, ["sft", str(config), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["calls_unreadable"] == {
        "unreadable_request": 1,
        "no_answer": 1,
    }
    assert [json.loads(line)["messages"][-1]["content"] for line in out.read_text().splitlines()] == [
        "It is 42."
    ]
