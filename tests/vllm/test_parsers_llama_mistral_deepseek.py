"""Llama 3 JSON, Mistral, DeepSeek V3/V3.1 and Kimi K2 tool-call parsing against vLLM's own parsers.

The same sampled texts are read by vLLM (``parser_reference.vllm_parse``) and by ours, whole and
streamed in every two-piece split and character by character. ``AGREE`` texts must give the same
tool calls (name and parsed arguments) and the same content (compared stripped). ``DIFFER`` texts
are where vLLM's reading differs from ours by design — it drops text around the calls, invents a
call from a cut or nameless block — and each asserts our reading, and that vLLM's still differs
(so the list stays true when vLLM changes).

vLLM reads Mistral's two forms with different code, chosen by whether ``[ARGS]`` is in the
vocabulary, so the pre-v11 texts go through a second vLLM run with a tokenizer that lacks it: two
vLLM subprocesses for this module, each run once.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.vllm.parser_reference import vllm_parse

from harnessrl.gateway.parsers.tools.base import collect
from harnessrl.gateway.parsers.tools.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from harnessrl.gateway.parsers.tools.kimi import KimiK2ToolParser
from harnessrl.gateway.parsers.tools.llama import Llama3JsonToolParser
from harnessrl.gateway.parsers.tools.mistral import MistralToolParser

pytestmark = pytest.mark.vllm


def _tool(name: str, arg: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {arg: {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = [_tool("bash", "cmd"), _tool("read", "path")]
OURS = {
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "mistral_pre_v11": MistralToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "kimi_k2": KimiK2ToolParser,
}

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI = ["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>"]
KIMI += ["<|tool_call_end|>", "<|tool_call_argument_begin|>"]
#: Every family's markers but Mistral's pre-v11 run's: they do not clash with one another.
SPECIAL_TOKENS = ["<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP]
SPECIAL_TOKENS += KIMI

NESTED = json.dumps(
    {"cmd": 'echo "héllo 世界" }{', "opts": {"n": [1, {"deep": None}], "ok": True}}, ensure_ascii=False
)
READ = '{"path": "日本/a.txt"}'
PLAIN = "No tools needed: the answer is 42 {not json}."


def ds3(name: str, args: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


def ds31(name: str, args: str) -> str:
    return f"{DS_CALL}{name}{DS_SEP}{args}{DS_CALL_END}"


def kimi(name: str, args: str, index: int) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


def kimi_section(*calls: str) -> str:
    return "<|tool_calls_section_begin|>" + "\n".join(calls) + "<|tool_calls_section_end|>"


AGREE: list[tuple[str, str]] = [
    ("llama3_json", '{"name": "bash", "parameters": {"cmd": "ls -la"}}'),
    (
        "llama3_json",
        f'\n<|python_tag|>{{"name": "bash", "arguments": {NESTED}}}; {{"name": "read", "parameters": {READ}}}',
    ),
    ("llama3_json", PLAIN),
    ("llama3_json", '{"answer": 42, "unit": "m"}'),  # a JSON answer: no name, so content
    ("llama3_json", '{"name": "bash", "parameters": {"cmd": "ls'),  # cut by max_tokens
    ("mistral", f"Sure, both.[TOOL_CALLS]bash[ARGS]{NESTED}[TOOL_CALLS]read[ARGS]{READ}"),
    ("mistral", '[TOOL_CALLS]bash{"cmd": "ls"}'),
    ("mistral", PLAIN),
    (
        "mistral_pre_v11",
        f'Sure.[TOOL_CALLS][{{"name": "bash", "arguments": {NESTED}}}, {{"name": "read", "arguments": {READ}}}]',
    ),
    ("mistral_pre_v11", '[TOOL_CALLS] {"name": "bash", "arguments": {"cmd": "ls"}}'),
    ("mistral_pre_v11", 'Hi [TOOL_CALLS][{"name": "bash", "arguments": {"cmd": "ls'),  # cut
    ("mistral_pre_v11", PLAIN),
    ("deepseek_v3", f"Let me look, 先.{DS_BEGIN}{ds3('bash', NESTED)}\n{ds3('read', READ)}{DS_END}"),
    ("deepseek_v3", f"{DS_BEGIN}{ds3('bash', '{}')}{DS_END}"),
    ("deepseek_v3", PLAIN),
    ("deepseek_v31", f"Let me look.{DS_BEGIN}{ds31('bash', NESTED)}{ds31('read', READ)}{DS_END}"),
    ("deepseek_v31", PLAIN),
    ("kimi_k2", f"Looking.{kimi_section(kimi('bash', NESTED, 0), kimi('read', READ, 1))}"),
    ("kimi_k2", PLAIN),
    # A header without Kimi's ":N" is not a call: the text comes back as content in both.
    (
        "kimi_k2",
        f"Hi{kimi_section('<|tool_call_begin|>bash<|tool_call_argument_begin|>{}<|tool_call_end|>')}",
    ),
]

LS = '{"name": "bash", "parameters": {"cmd": "ls"}}'
LS_ARGS = '{"cmd": "ls"}'
DS3_CUT = f"Hi{DS_BEGIN}{ds3('bash', LS_ARGS)[:-12]}"
DS31_CUT = f'Hi{DS_BEGIN}{ds31("bash", LS_ARGS)}{DS_CALL}read{DS_SEP}{{"pa'
KIMI_CUT = "Hi<|tool_calls_section_begin|>" + kimi("bash", '{"cmd": "l', 0)[: -len("<|tool_call_end|>")]
# (parser, text, our content, our calls as (name, arguments), why vLLM differs)
DIFFER: list[tuple[str, str, str | None, list[tuple[str, dict[str, Any]]], str]] = [
    (
        "llama3_json",
        f"Let me check. {LS}",
        f"Let me check. {LS}",
        [],
        "vLLM takes bare JSON anywhere (dropping the prose); we only at the start or after a tag",
    ),
    ("llama3_json", f"{LS} Done.", "Done.", [("bash", {"cmd": "ls"})], "vLLM drops text after the calls"),
    (
        "llama3_json",
        f"Checking.<|python_tag|>{LS}",
        "Checking.",
        [("bash", {"cmd": "ls"})],
        "vLLM drops the text before the calls",
    ),
    (
        "llama3_json",
        '{"name": "bash", "parameters": "{\\"cmd\\": \\"ls\\"}"}',
        None,
        [("bash", {"cmd": "ls"})],
        "vLLM keeps string parameters as a JSON string; we read them as the object they encode",
    ),
    (
        "mistral",
        '[TOOL_CALLS]bash[ARGS]{"cmd": "ls"} and more',
        "and more",
        [("bash", {"cmd": "ls"})],
        "vLLM drops text after a call",
    ),
    (
        "mistral",
        'Hi[TOOL_CALLS]bash[ARGS]{"cmd": "l',
        'Hi[TOOL_CALLS]bash[ARGS]{"cmd": "l',
        [],
        "vLLM returns the cut arguments as a call (not even JSON)",
    ),
    (
        "mistral",
        "Hi[TOOL_CALLS]bash",
        "Hi[TOOL_CALLS]bash",
        [],
        "vLLM invents a call with {} from a bare name",
    ),
    (
        "mistral_pre_v11",
        '[TOOL_CALLS][{"name": "bash", "arguments": {"cmd": "ls"}}] after',
        "after",
        [("bash", {"cmd": "ls"})],
        "vLLM drops text after the array",
    ),
    (
        "mistral_pre_v11",
        'Hi [TOOL_CALLS][{"arguments": {"cmd": "ls"}}]',
        'Hi [TOOL_CALLS][{"arguments": {"cmd": "ls"}}]',
        [],
        'vLLM makes an entry without a name a call named ""',
    ),
    (
        "mistral_pre_v11",
        '[TOOL_CALLS][{"name": "bash", "arguments": {}}][TOOL_CALLS][{"name": "read", "arguments": {}}]',
        None,
        [("bash", {}), ("read", {})],
        "vLLM reads only the first [TOOL_CALLS] block and drops the rest",
    ),
    (
        "deepseek_v3",
        f"Hi{DS_BEGIN}{ds3('bash', NESTED)}{DS_END} bye",
        "Hi bye",
        [("bash", json.loads(NESTED))],
        "vLLM drops text after the section",
    ),
    (
        "deepseek_v3",
        DS3_CUT,
        DS3_CUT,
        [],
        "vLLM drops a cut section (content is only the text before it)",
    ),
    (
        "deepseek_v3",
        f"{DS_BEGIN}{ds3('bash', json.dumps(json.loads(NESTED), indent=2, ensure_ascii=False))}{DS_END}",
        None,
        [("bash", json.loads(NESTED))],
        "vLLM's V3 regex reads only one-line arguments and drops a pretty-printed call",
    ),
    (
        "deepseek_v31",
        DS31_CUT,
        DS31_CUT,
        [],
        "vLLM keeps the complete call of a cut section and drops the rest; the section is our unit",
    ),
    (
        "kimi_k2",
        f"Hi{kimi_section(kimi('bash', '{}', 0))} bye",
        "Hi bye",
        [("bash", {})],
        "vLLM drops text after the section",
    ),
    (
        "kimi_k2",
        KIMI_CUT,
        KIMI_CUT,
        [],
        "vLLM returns the cut arguments as a call (not JSON: the reference worker fails on it)",
    ),
]


def ours(parser: str, pieces: list[str]) -> dict[str, Any]:
    p = OURS[parser](TOOLS)
    message = collect([e for piece in pieces for e in p.feed(piece)] + p.finish())
    return {
        "content": (message.content or "").strip(),
        "tool_calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in message.tool_calls],
    }


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every position, and character by character."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def _cases(pre_v11: bool) -> list[tuple[str, str]]:
    texts = [(p, t) for p, t in AGREE] + [(p, t) for p, t, *_ in DIFFER]
    return [(p, t) for p, t in texts if (p == "mistral_pre_v11") == pre_v11]


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str], dict[str, Any]]:
    """vLLM's reading of every text: one run with all families' markers, one for pre-v11 Mistral."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for pre_v11, tokens in ((False, SPECIAL_TOKENS), (True, ["[TOOL_CALLS]"])):
        cases = _cases(pre_v11)
        requests = [
            {"tool_parser": "mistral" if p == "mistral_pre_v11" else p, "text": t, "tools": TOOLS}
            for p, t in cases
        ]
        results.update(zip(cases, vllm_parse(requests, special_tokens=tokens), strict=True))
    return results


def _theirs(result: dict[str, Any]) -> dict[str, Any]:
    if "error" in result:
        return result
    return {"content": (result["content"] or "").strip(), "tool_calls": result["tool_calls"]}


@pytest.mark.parametrize(("parser", "text"), AGREE)
def test_we_read_as_vllm_does_streamed_or_not(
    reference: dict[tuple[str, str], dict[str, Any]], parser: str, text: str
) -> None:
    theirs = _theirs(reference[(parser, text)])
    whole = ours(parser, [text])
    assert whole == theirs
    for pieces in splits(text):
        assert ours(parser, pieces) == whole, pieces


@pytest.mark.parametrize(("parser", "text", "content", "calls", "why"), DIFFER)
def test_where_vllm_differs_we_read_as_designed(
    reference: dict[tuple[str, str], dict[str, Any]],
    parser: str,
    text: str,
    content: str | None,
    calls: list[tuple[str, dict[str, Any]]],
    why: str,
) -> None:
    expected = {
        "content": (content or "").strip(),
        "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
    }
    whole = ours(parser, [text])
    assert whole == expected
    assert _theirs(reference[(parser, text)]) != expected, f"vLLM now agrees ({why}): move it to AGREE"
    for pieces in splits(text):
        assert ours(parser, pieces) == whole, pieces
