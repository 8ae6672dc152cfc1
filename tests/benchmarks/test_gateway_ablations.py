"""``benchmarks/gateway_ablations.py``'s ablations: each takes out exactly the stage it names, against
the full gateway as the control, and the call is still answered (the benchmark itself is run by
hand, never as a timed test)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from tests.benchmarks.scripts import load_benchmark

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.pool import EnginePool
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "ablations-admin"
LONG = "Please read the failing test output below and fix the parser. " * 8  # 512 characters
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run one shell command in the repository",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def ab() -> ModuleType:
    return load_benchmark("gateway_ablations")


@pytest.fixture(scope="module")
def tokenizer() -> PolicyTokenizer:
    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


class CountedEngine(ScriptedEngine):
    """The scripted engine, counting the generations it was asked for."""

    generations = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.generations += 1
        return super().generate(*args, **kwargs)


def one_call(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp: Path, ablation: str | None, calls: int = 1
) -> dict[str, Any]:
    """``calls`` chat calls (a long user message, tools, logprobs asked; each in a rollout of its own)
    through a gateway with ``ablation`` in place (None: the full gateway), its engine a pool over one
    scripted replica as ``harnessrl gateway``'s is over vLLM: the last answer, what the store holds
    of the last rollout, and how many generations the engine was asked for."""
    store = SQLiteStore(tmp / f"{ablation or 'full'}.db")
    engine = CountedEngine(["Done: the parser keeps no leading space now."] * calls, tokenizer)
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)
        if ablation is not None:
            stack.enter_context(ab.ABLATIONS[ablation]())
        app = create_app(GatewayConfig(admin_key=ADMIN), store, EnginePool([engine]))
        url = stack.enter_context(serve_in_thread(app))
        client = stack.enter_context(contextlib.closing(GatewayClient(url, ADMIN)))
        body = {
            "model": "policy",
            "messages": [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": LONG}],
            "tools": TOOLS,
            "logprobs": True,
        }
        for _ in range(calls):
            rollout = client.create_rollout({"prompt": "ablation"})
            answer = httpx.post(
                f"{rollout['base_url']}/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {rollout['api_key']}"},
                timeout=30,
            )
        recorded = store.list_calls(rollout["rollout_id"])
    return {
        "status": answer.status_code,
        "answer": answer.json(),
        "calls": recorded,
        "generations": engine.generations,
    }


@pytest.fixture(scope="module")
def full(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    return one_call(ab, tokenizer, tmp_path_factory.mktemp("full"), None)


def _has_run(ids: list[int], value: int, length: int) -> bool:
    return any(ids[i : i + length] == [value] * length for i in range(len(ids) - length + 1))


def test_the_full_gateway_records_the_real_prompt_and_answers_logprobs(
    full: dict[str, Any], tokenizer: PolicyTokenizer
) -> None:
    assert full["status"] == 200
    (call,) = full["calls"]
    text = tokenizer.decode(call.prompt_token_ids)
    assert LONG in text and "Run one shell command" in text  # the template's tools header
    assert not _has_run(call.prompt_token_ids, 7, len(LONG) // 4)
    # An entry per sampled token but the end-of-turn one, which is not part of the answer's text.
    assert len(full["answer"]["choices"][0]["logprobs"]["content"]) == len(call.response_token_ids) - 1


def test_record_answers_the_call_and_writes_nothing(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path, full: dict[str, Any]
) -> None:
    out = one_call(ab, tokenizer, tmp_path, "record")
    assert out["status"] == 200 and out["calls"] == []
    assert out["answer"]["choices"][0]["message"] == full["answer"]["choices"][0]["message"]


def test_tail_encode_stands_in_for_the_long_texts_only(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    out = one_call(ab, tokenizer, tmp_path, "tail_encode")
    assert out["status"] == 200
    (call,) = out["calls"]
    assert _has_run(call.prompt_token_ids, 7, len(LONG) // 4)  # one stand-in ID per 4 characters
    assert "<|im_start|>" in tokenizer.decode(call.prompt_token_ids)  # special tokens stay real


def test_template_render_drops_the_tools_header(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    out = one_call(ab, tokenizer, tmp_path, "template_render")
    assert out["status"] == 200
    (call,) = out["calls"]
    text = tokenizer.decode(call.prompt_token_ids)
    assert LONG in text and "Run one shell command" not in text
    assert text.endswith("<|im_start|>assistant\n")


def test_answer_logprobs_leaves_them_out_of_the_answer_only(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    out = one_call(ab, tokenizer, tmp_path, "answer_logprobs")
    assert out["status"] == 200 and out["answer"]["choices"][0]["logprobs"] is None
    (call,) = out["calls"]
    assert len(call.response_logprobs) == len(call.response_token_ids) > 0  # still recorded


def test_pipeline_answers_the_fixed_completion_without_the_engine(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    out = one_call(ab, tokenizer, tmp_path, "pipeline")
    assert out["status"] == 200 and out["answer"]["id"] == "chatcmpl-fixed"
    assert out["calls"] == []


def test_engine_call_asks_the_engine_once_and_answers_its_samples_again(
    ab: ModuleType, tokenizer: PolicyTokenizer, tmp_path: Path, full: dict[str, Any]
) -> None:
    control = one_call(ab, tokenizer, tmp_path / "control", None, calls=3)
    assert control["generations"] == 3
    out = one_call(ab, tokenizer, tmp_path, "engine_call", calls=3)
    assert out["status"] == 200 and out["generations"] == 1
    (call,) = out["calls"]
    assert call.response_token_ids == full["calls"][0].response_token_ids  # the first call's samples


def test_every_ablation_is_undone_on_leaving(ab: ModuleType) -> None:
    from harnessrl.gateway import app
    from harnessrl.gateway.apis.chat import ChatAnswer
    from harnessrl.gateway.writer import CallWriter

    methods = (CallWriter.add_now, PolicyTokenizer.encode, PolicyTokenizer.render_chat, ChatAnswer.__init__)
    before = (*methods, EnginePool.generate)
    route = app.MODEL_POSTS["/chat/completions"]
    for name in ab.ABLATIONS:
        with ab.ABLATIONS[name]():
            pass
    methods = (CallWriter.add_now, PolicyTokenizer.encode, PolicyTokenizer.render_chat, ChatAnswer.__init__)
    after = (*methods, EnginePool.generate)
    assert after == before and app.MODEL_POSTS["/chat/completions"] is route
