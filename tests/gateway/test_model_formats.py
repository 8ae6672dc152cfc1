"""Choosing the tool-call and reasoning parsers from the model's chat template, and what a harness
sees when the policy writes a tool call it does not finish."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from tests.gateway.conftest import ADMIN_KEY

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.errors import ConfigError
from harnessrl.gateway import create_app
from harnessrl.gateway.parsers.formats import RULES, detect_formats, resolve_formats
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

# A line of each family's real template (how it renders an earlier turn's tool call).
TEMPLATES = {
    "qwen3_coder": "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k }}",
    "glm45": "{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value>",
    "openai": "<|start|>assistant<|channel|>commentary to=functions.{{ name }}<|message|>{{ args }}<|call|>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ name }}<｜tool▁sep｜>{{ args }}</think>",
    "deepseek_v3": "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ name }}\\n```json\\n{{ args }}\\n```",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>{{ id }}<|tool_call_argument_begin|>",
    "mistral": "[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]{{ calls }}",
    "llama3_json": "<|start_header_id|>ipython<|end_header_id|><|python_tag|>{{ call }}<|eot_id|>",
    "hermes": "<tool_call>\\n{{ call | tojson }}\\n</tool_call>",
}


@pytest.mark.parametrize("parser", sorted(TEMPLATES))
def test_each_familys_template_chooses_its_parser(parser: str) -> None:
    assert detect_formats(TEMPLATES[parser]).tool_parser == parser


def test_every_rule_is_reachable_and_no_marker_keeps_todays_parsers() -> None:
    detected = {detect_formats(TEMPLATES[p]).source for p in TEMPLATES}
    assert {rule.family for rule in RULES} - detected <= {"DeepSeek R1", "Llama 3.x (JSON)"}
    plain = detect_formats("{{ message.content }}<|im_end|>")
    assert (plain.tool_parser, plain.reasoning_parser, plain.source) == ("hermes", "qwen3", "default")
    # Named templates (tool_use, default) are all read.
    assert detect_formats({"default": "x", "tool_use": TEMPLATES["mistral"]}).tool_parser == "mistral"


def test_a_configured_name_wins_over_the_template() -> None:
    chosen = resolve_formats("hermes", "auto", TEMPLATES["glm45"])
    assert (chosen.tool_parser, chosen.reasoning_parser) == ("hermes", "glm45")
    assert resolve_formats("hermes", "qwen3", TEMPLATES["glm45"]).source == "configured"


def test_tiny_models_template_is_hermes_and_health_says_how_it_was_chosen(gateway: Any) -> None:
    formats = httpx.get(f"{gateway.url}/api/health").json()["formats"]
    assert formats == {
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
        "chosen_by": "Hermes / Qwen2.5 / Qwen3",
    }


def test_an_unknown_parser_name_is_a_config_error_naming_the_known_ones(
    tokenizer: PolicyTokenizer, tmp_path: Any
) -> None:
    store = SQLiteStore(tmp_path / "s.db")
    try:
        with pytest.raises(ConfigError, match=r"tool_call_parser: unknown parser 'qwen9'.*hermes"):
            create_app(
                GatewayConfig(admin_key="k", tool_call_parser="qwen9"),
                store,
                ScriptedEngine(["x"], tokenizer),
            )
    finally:
        store.close()


def _malformed(gateway: Any) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    lines = [line for line in text.splitlines() if line.startswith("harnessrl_tool_calls_malformed_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


BASH_TOOL = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
}


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_the_policy_did_not_finish_reaches_the_harness_as_text_and_is_counted(
    make_gateway: Callable[..., Any], stream: bool
) -> None:
    cut = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls'
    gateway = make_gateway([cut])
    rollout = gateway.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"])
    messages: Any = [{"role": "user", "content": "list files"}]
    if stream:
        chunks = list(
            client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL], stream=True)
        )
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    else:
        answer = client.chat.completions.create(model="m", messages=messages, tools=[BASH_TOOL])
        assert answer.choices[0].message.tool_calls is None
        content = answer.choices[0].message.content or ""
    assert content == cut
    assert _malformed(gateway) == 1
    client.close()


def test_every_rule_names_registered_parsers() -> None:
    """A detected family whose parser is missing would stop the gateway from starting."""
    from harnessrl.gateway.parsers.reasoning import REASONING_PARSERS
    from harnessrl.gateway.parsers.tools import TOOL_PARSERS

    for rule in RULES:
        assert rule.tool_parser in TOOL_PARSERS, rule
        assert rule.reasoning_parser is None or rule.reasoning_parser in REASONING_PARSERS, rule
