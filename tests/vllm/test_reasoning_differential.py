"""harnessrl's reasoning parsers (and the harmony tool parser) against vLLM's own, on generated texts.

All texts go to vLLM in one subprocess (``parser_reference.vllm_parse``, module-scoped): the
``<think>`` families through vLLM's reasoning parsers (thinking on, and ``enable_thinking: false``
for answers whose prompt did not open the block), gpt-oss texts through vLLM's ``HarmonyParser`` on
the token ids Harmony's encoding gives them. Reasoning and content are compared trimmed (vLLM trims
the end of the reasoning for some families; None counts as ""), and ours must give the same result
for every split of the text into two pieces and character by character.

Where we differ from vLLM by design, the test asserts ours and says why (see
``gateway.reasoning_parsers`` and ``gateway.tool_parsers.harmony``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from tests.vllm.parser_reference import vllm_parse

from harnessrl.gateway.parsers.reasoning import ContentText, ReasoningText, get_reasoning_parser
from harnessrl.gateway.parsers.tools import collect
from harnessrl.gateway.parsers.tools.harmony import HarmonyToolParser

pytestmark = pytest.mark.vllm

BASH = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
}

#: Each family's markers. vLLM's engine parsers drop special tokens foreign to their grammar, so a
#: family's texts only use its own.
TOOL_MARKER = {
    "qwen3": "<tool_call>",
    "glm45": "<tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|>",
    "deepseek_r1": None,
    "deepseek_v3": None,
}
SPECIAL_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|tool_calls_section_begin|>"]
#: ``chat_template_kwargs`` that make vLLM's parser read a text as thinking (on) or not (off); None:
#: its default. deepseek_r1 has no switch (it always thinks).
THINKING = {
    "qwen3": (None, {"enable_thinking": False}),
    "glm45": (None, {"enable_thinking": False}),
    "kimi_k2": (None, {"thinking": False}),
    "deepseek_r1": (None, None),
    "deepseek_v3": ({"thinking": True}, None),
}


def think_texts(family: str) -> list[str]:
    marker = TOOL_MARKER[family]
    bodies = ["plan 计划 🤔", "\nstep 1\nstep 2\n"]
    answers = ["The answer.", "\n\nanswer with <think> inside", ""]
    texts = []
    for body, answer in itertools.product(bodies, answers):
        texts += [
            f"<think>{body}</think>{answer}",  # the model opened the block
            f"  <think>{body}</think>{answer}",
            f"{body}</think>{answer}",  # the prompt opened it
            f"<think>{body}</think>{answer}</think> tail",  # a stray closing tag
        ]
    for body in bodies:
        texts += [f"<think>{body}", body]  # unclosed: cut by max_tokens, or no tags at all
        if marker:
            texts.append(f"<think>{body}{marker}call body")  # a tool call ends the reasoning
    return texts


CALL = '<|start|>assistant<|channel|>commentary to=functions.bash <|constrain|>json<|message|>{{"cmd": "{cmd}"}}{end}'
CALL_TO_FIRST = (
    '<|start|>assistant to=functions.bash<|channel|>commentary json<|message|>{{"cmd": "{cmd}"}}{end}'
)


def harmony_texts() -> list[str]:
    analysis = "<|channel|>analysis<|message|>I should look 世界.<|end|>"
    preamble = "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>"
    final = "<|start|>assistant<|channel|>final<|message|>The answer is 42 ✓."
    calls = [
        CALL.format(cmd="ls -la", end="<|call|>"),
        CALL.format(cmd="echo héllo", end=""),  # <|call|> is a stop token: not decoded
        CALL_TO_FIRST.format(cmd="pwd", end=""),
        CALL.format(cmd="ls", end="<|call|>") + CALL_TO_FIRST.format(cmd="cat a", end="<|call|>"),
    ]
    texts = []
    for head, middle in itertools.product(["", analysis], ["", preamble]):
        texts += [head + middle + final, head + middle + final + "<|return|>"]
        texts += [head + middle + call for call in calls]
    # The prompt ends with <|start|>assistant: the turn's first message starts without it.
    texts = [t.removeprefix("<|start|>assistant") for t in texts]
    texts += [
        "<|channel|>analysis<|message|>cut by max_tok",  # unclosed reasoning
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
        + final,
        CALL.format(cmd="ls", end="").removeprefix("<|start|>assistant"),  # the first message is a call
        "<|channel|>final<|message|>  padded  <|return|>",
        "plain text, no harmony",
    ]
    return texts


#: Texts where vLLM differs by design: ours is asserted instead (see ``test_harmony_departures``).
HARMONY_DEPARTURES = {
    "bad_json": "<|channel|>analysis<|message|>a<|end|>" + CALL.format(cmd="ls", end="")[:-2],
    "array": "<|channel|>commentary to=functions.bash <|constrain|>json<|message|>[1, 2]<|call|>",
    "builtin": "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=browser.search"
    ' json<|message|>{"q": "x"}<|call|>',
    "junk": "<|channel|>final<|message|>x<|end|>junk between",
}


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    for family in TOOL_MARKER:
        for text in think_texts(family):
            for mode, kwargs in zip(("on", "off"), THINKING[family], strict=True):
                case: dict[str, Any] = {"reasoning_parser": family, "text": text, "mode": mode}
                if kwargs is not None:
                    case["chat_template_kwargs"] = kwargs
                cases.append(case)
    for text in harmony_texts() + list(HARMONY_DEPARTURES.values()):
        cases.append({"harmony": True, "text": text, "tools": [BASH]})
    results = vllm_parse(cases, special_tokens=SPECIAL_TOKENS)
    table = {}
    for case, result in zip(cases, results, strict=True):
        assert "error" not in result, (case, result)
        table[(case.get("reasoning_parser"), case["text"], case.get("mode", "harmony"))] = result
    return table


def trimmed(value: str | None) -> str:
    return (value or "").strip()


def ours_split(family: str, pieces: list[str], starts: bool) -> tuple[str, str]:
    parser = get_reasoning_parser(family)(starts_in_reasoning=starts)
    events = [e for piece in pieces for e in parser.feed(piece)] + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    content = "".join(e.text for e in events if isinstance(e, ContentText))
    return reasoning, content


def splits(text: str) -> list[list[str]]:
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def check_think(family: str, text: str, starts: bool, theirs: dict[str, Any]) -> None:
    reasoning, content = ours_split(family, [text], starts)
    assert (trimmed(reasoning), trimmed(content)) == (
        trimmed(theirs["reasoning"]),
        trimmed(theirs["content"]),
    ), (
        family,
        starts,
        text,
    )
    for pieces in splits(text):
        assert ours_split(family, pieces, starts) == (reasoning, content), pieces


def deepseek_late_open(family: str, text: str) -> bool:
    """vLLM's deepseek_r1 cuts the text at its first ``<think>`` even when that comes after the
    block, dropping the reasoning and the answer before it: ours keeps them (a vLLM bug, not a rule)."""
    if not family.startswith("deepseek") or "<think>" not in text:
        return False
    close = text.find("</think>")
    return 0 <= close < text.find("<think>")


def check_deepseek_late_open(family: str, text: str, starts: bool) -> None:
    reasoning, content = ours_split(family, [text], starts)
    head, _, tail = text.partition("</think>")
    assert (reasoning, content) == (head, tail)


@pytest.mark.parametrize("family", list(TOOL_MARKER))
def test_prompt_opened_block_matches_vllm_with_thinking_on(family: str, reference: dict[str, Any]) -> None:
    # vLLM's parsers assume thinking is on: the text starts inside the block, as when the prompt opened it.
    for text in think_texts(family):
        if deepseek_late_open(family, text):
            check_deepseek_late_open(family, text, True)
            continue
        check_think(family, text, True, reference[(family, text, "on")])


@pytest.mark.parametrize("family", list(TOOL_MARKER))
def test_unopened_block_matches_vllm(family: str, reference: dict[str, Any]) -> None:
    for text in think_texts(family):
        if deepseek_late_open(family, text) and family == "deepseek_r1":
            check_deepseek_late_open(family, text, False)
        elif family == "deepseek_r1":
            # R1 always thinks: vLLM has no switch and neither do we (the flag is ignored).
            check_think(family, text, False, reference[(family, text, "on")])
        elif text.lstrip().startswith("<think>"):
            # The model opened the block itself: vLLM (thinking on) reads it the same way.
            check_think(family, text, False, reference[(family, text, "on")])
        elif family == "glm45" and "<think>" in text:
            # GLM opens a block wherever <think> appears in the content (vLLM's grammar does too, once
            # in content); vLLM with thinking off parses nothing at all.
            reasoning, _ = ours_split(family, [text], False)
            assert reasoning.strip() == "inside"
        else:
            # No block: the text is the answer, as vLLM says with thinking off.
            check_think(family, text, False, reference[(family, text, "off")])


def ours_harmony(pieces: list[str]) -> dict[str, Any]:
    splitter, tools = (
        get_reasoning_parser("openai_gptoss")(starts_in_reasoning=False),
        HarmonyToolParser([BASH]),
    )
    events = [e for piece in pieces for e in splitter.feed(piece)] + splitter.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    parsed = [p for e in events if isinstance(e, ContentText) for p in tools.feed(e.text)] + tools.finish()
    message = collect(parsed)
    return {
        "reasoning": trimmed(reasoning),
        "content": trimmed(message.content),
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls],
        "malformed": tools.malformed,
    }


def test_harmony_matches_vllm(reference: dict[str, Any]) -> None:
    for text in harmony_texts():
        theirs = reference[(None, text, "harmony")]
        whole = ours_harmony([text])
        assert whole == {
            "reasoning": trimmed(theirs["reasoning"]),
            "content": trimmed(theirs["content"]),
            "tool_calls": theirs["tool_calls"],
            "malformed": 0,
        }, text
        for pieces in splits(text):
            assert ours_harmony(pieces) == whole, pieces


def test_harmony_departures(reference: dict[str, Any]) -> None:
    theirs = {name: reference[(None, text, "harmony")] for name, text in HARMONY_DEPARTURES.items()}
    ours = {name: ours_harmony([text]) for name, text in HARMONY_DEPARTURES.items()}
    # Arguments that are not a JSON object: vLLM makes a call with them as they are (a harness then
    # fails to parse them); ours never invents a call: the block stays in the content as text.
    assert theirs["bad_json"]["tool_calls"] == [{"name": "bash", "arguments": '{"cmd": "ls'}]
    assert ours["bad_json"]["tool_calls"] == [] and ours["bad_json"]["malformed"] == 1
    assert ours["bad_json"]["content"].endswith('<|message|>{"cmd": "ls')
    assert theirs["array"]["tool_calls"] == [{"name": "bash", "arguments": [1, 2]}]
    assert ours["array"]["tool_calls"] == [] and ours["array"]["malformed"] == 1
    # A call to a built-in tool: vLLM drops it silently; ours keeps it visible as text.
    assert theirs["builtin"]["tool_calls"] == [] and trimmed(theirs["builtin"]["content"]) == ""
    assert "to=browser.search" in ours["builtin"]["content"] and ours["builtin"]["malformed"] == 1
    # Text outside any message: vLLM drops it; ours keeps what was sampled.
    assert trimmed(theirs["junk"]["content"]) == "x"
    assert ours["junk"]["content"] == "xjunk between"
    for name in HARMONY_DEPARTURES:
        assert ours[name]["reasoning"] == trimmed(theirs[name]["reasoning"]), name
