"""Qwen3-Coder XML and GLM tool-call parsing against vLLM's ``qwen3_coder``/``qwen3_xml``/``glm45``/``glm47``.

Every text is read by vLLM (one worker run for the module) and by ours. Where the two agree, the
tool calls (name and parsed arguments) and the stripped content must be equal. Where they differ
by design, the case pins both readings, ours and vLLM's, and says why ours is what it is, so a
change on either side shows up here. Ours is also read streamed, in every split into two pieces
and char by char, and must equal the whole reading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from tests.vllm.parser_reference import vllm_parse

from harnessrl.gateway.parsers.tools.base import collect
from harnessrl.gateway.parsers.tools.glm import GlmToolParser
from harnessrl.gateway.parsers.tools.qwen_xml import QwenXmlToolParser

pytestmark = pytest.mark.vllm

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "force": {"type": "boolean"},
                    "env": {"type": "object"},
                    "args": {"type": "array"},
                    "maybe": {"type": ["integer", "null"]},
                    "odd": {"type": "widget"},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
FAMILIES = {
    "qwen": (QwenXmlToolParser, ("qwen3_coder", "qwen3_xml")),
    "glm": (GlmToolParser, ("glm45", "glm47")),
}
MARKERS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
MARKERS += ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]  # GLM's own special tokens


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm45_call(name: str, **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in params.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


def glm47_call(name: str, **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in params.items())
    return f"<tool_call>{name}{body}</tool_call>"


NESTED = '{"PATH": "/bin", "deep": {"list": [1, 2.5, {"z": null}], "ok": true}, "ünï": "世界"}'
TYPED = {"timeout": "30", "ratio": "0.25", "force": "false", "maybe": "null", "odd": "[1, 2]"}
MULTILINE = "cat > a.py <<'EOF'\ndef f():\n    return '<b>' if x > 1 else \"ü\"\nEOF"

SAME = {
    "qwen": [
        "Let me look.\n" + qwen_call("run", cmd="ls -la"),
        qwen_call("run", cmd='echo "héllo 世界 🚀"', env=NESTED) + "\n" + qwen_call("noop"),
        qwen_call("run", cmd=MULTILINE, args='[["x", 1], {"y": [true]}]', **TYPED),
        qwen_call("run", cmd="\n  indented, with blank lines around\n"),
        qwen_call("run", cmd="grep '</tool_call>' log.txt"),  # markup inside a value is text
        "<tool_call>\n<function=noop>\n</function>\n<function=run>\n<parameter=timeout>\n5\n</parameter>\n"
        "</function>\n</tool_call>",  # two functions in one block
        "No tools needed: 2 < 3 and 5 > 4.",
        "<tool_call>\n<function=>\n</function>\n</tool_call>",  # no name: text for both
    ],
    "glm": [
        "Let me look.\n" + glm45_call("run", cmd="ls -la"),
        glm45_call("run", cmd='echo "héllo 世界 🚀"', env=NESTED) + glm47_call("noop"),
        glm47_call("run", cmd=MULTILINE, args='[["x", 1], {"y": [true]}]', **TYPED),
        glm45_call("run", cmd="\nkeeps its newlines\n"),
        glm47_call("run", cmd="a <arg_key> b"),
        "No tools needed: 2 < 3 and 5 > 4.",
        "<tool_call>\n</tool_call>",  # no name: text for both
    ],
}


@dataclass(frozen=True)
class Differs:
    """A text vLLM reads otherwise: ``ours`` and ``vllm`` are ``(content, calls)``; ``why`` says why."""

    text: str
    ours: tuple[str, list[tuple[str, dict[str, Any]]]]
    vllm: tuple[str, list[tuple[str, dict[str, Any]]]]
    why: str
    malformed: int = 0


TRUNCATED_Q = "I'll run it.\n<tool_call>\n<function=run>\n<parameter=cmd>\nls -la /very/long/pa"
NO_CLOSE_Q = qwen_call("run", cmd="ls")[: -len("\n</tool_call>")]
JUNK_Q = "<tool_call>\nSure, calling:\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"
BARE_Q = "<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>"
UNCLOSED_Q = "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>"
FUNC_END_Q = qwen_call("run", cmd="sed -n '/<\\/function>/p' f.xml </function>")
TRUNCATED_G = "I'll run it.\n<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls -la /very/long/pa"
JUNK_G = "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\nand then\n</tool_call>"
END_IN_VALUE_G = glm47_call("run", cmd="grep '</tool_call>' log.txt")

DIFFERS = {
    "qwen": [
        Differs(
            "Before.\n" + qwen_call("run", cmd="ls") + "\nAfter.",
            ours=("Before.\n\nAfter.", [("run", {"cmd": "ls"})]),
            vllm=("Before.", [("run", {"cmd": "ls"})]),
            why="vLLM's one-pass extraction drops content that follows a call; ours keeps all the text",
        ),
        Differs(
            TRUNCATED_Q,
            ours=(TRUNCATED_Q, []),
            vllm=("I'll run it.", [("run", {})]),
            why="cut by max_tokens: vLLM invents a call without its unfinished argument; ours is text",
            malformed=1,
        ),
        Differs(
            NO_CLOSE_Q,
            ours=(NO_CLOSE_Q, []),
            vllm=("", [("run", {"cmd": "ls"})]),
            why="no </tool_call>: the block is unfinished, so text (vLLM accepts it)",
            malformed=1,
        ),
        Differs(
            JUNK_Q,
            ours=(JUNK_Q, []),
            vllm=("", [("run", {"cmd": "ls"})]),
            why="text inside a block breaks the format; vLLM silently drops that text",
            malformed=1,
        ),
        Differs(
            BARE_Q,
            ours=(BARE_Q, []),
            vllm=("", [("run", {"cmd": "ls"})]),
            why="vLLM also takes a bare <function=...> outside <tool_call>; ours reads only blocks",
        ),
        Differs(
            UNCLOSED_Q,
            ours=("", [("run", {"cmd": "ls\n<parameter=timeout>\n5"})]),
            vllm=("", [("run", {"cmd": "ls", "timeout": 5})]),
            why="only </parameter> ends a value, so a value may hold '<parameter='; vLLM ends it there",
        ),
        Differs(
            FUNC_END_Q,
            ours=("", [("run", {"cmd": "sed -n '/<\\/function>/p' f.xml </function>"})]),
            vllm=("", [("run", {})]),
            why="'</function>' inside a value ends vLLM's call and loses the value; ours keeps it",
        ),
        Differs(
            "<tool_call>\n<function=run>\n<parameter=cmd >\nls\n</parameter>\n</function>\n</tool_call>",
            ours=("", [("run", {"cmd": "ls"})]),
            vllm=("", [("run", {"cmd ": "ls"})]),
            why="ours trims the key as it trims the name; vLLM keeps a trailing space in the key",
        ),
        Differs(
            "Done </think> now.\n" + qwen_call("noop"),
            ours=("Done </think> now.", [("noop", {})]),
            vllm=("Done  now.", [("noop", {})]),
            why="vLLM's qwen3 grammar drops a stray </think>; reasoning is not the tool parser's job here",
        ),
    ],
    "glm": [
        Differs(
            "Before.\n" + glm45_call("run", cmd="ls") + "\nAfter.",
            ours=("Before.\n\nAfter.", [("run", {"cmd": "ls"})]),
            vllm=("Before.", [("run", {"cmd": "ls"})]),
            why="vLLM's one-pass extraction drops content that follows a call; ours keeps all the text",
        ),
        Differs(
            TRUNCATED_G,
            ours=(TRUNCATED_G, []),
            vllm=("I'll run it.", [("run", {})]),
            why="cut by max_tokens: vLLM invents a call without its unfinished argument; ours is text",
            malformed=1,
        ),
        Differs(
            glm45_call("fetch", url="https://example.com"),
            ours=("", [("fetch", {"url": "https://example.com"})]),
            vllm=(glm45_call("fetch", url="https://example.com"), []),
            why="vLLM's GLM parser drops calls to tools not in the request; ours returns them, as for "
            "every other family, and the harness answers 'unknown tool'",
        ),
        Differs(
            JUNK_G,
            ours=(JUNK_G, []),
            vllm=("", [("run", {"cmd": "ls"})]),
            why="text inside a block breaks the format; vLLM silently drops that text",
            malformed=1,
        ),
        Differs(
            END_IN_VALUE_G,
            ours=("", [("run", {"cmd": "grep '</tool_call>' log.txt"})]),
            vllm=("", [("run", {})]),
            why="'</tool_call>' inside a value ends vLLM's call and loses the value; ours keeps it",
        ),
    ],
}


def ours(family: str, text: str, pieces: list[str] | None = None) -> dict[str, Any]:
    parser = FAMILIES[family][0](TOOLS)
    events = [e for piece in (pieces if pieces is not None else [text]) for e in parser.feed(piece)]
    message = collect(events + parser.finish())
    return {
        "content": (message.content or "").strip(),
        "calls": [(c.name, json.loads(c.arguments)) for c in message.tool_calls],
        "malformed": parser.malformed,
    }


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every position, and character by character."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def all_texts() -> list[tuple[str, str]]:
    return [(f, t) for f in FAMILIES for t in SAME[f] + [d.text for d in DIFFERS[f]]]


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str], dict[str, Any]]:
    """vLLM's reading of every text, under each of the family's parser names: one worker run."""
    keys = [(name, text) for family, text in all_texts() for name in FAMILIES[family][1]]
    cases = [{"tool_parser": name, "text": text, "tools": TOOLS} for name, text in keys]
    results = vllm_parse(cases, special_tokens=MARKERS)
    return dict(zip(keys, results, strict=True))


def theirs(reference: dict[tuple[str, str], dict[str, Any]], family: str, text: str) -> list[dict[str, Any]]:
    readings = []
    for name in FAMILIES[family][1]:
        result = reference[(name, text)]
        assert "error" not in result, (name, result)
        calls = [(c["name"], c["arguments"]) for c in result["tool_calls"]]
        readings.append({"content": (result["content"] or "").strip(), "calls": calls})
    return readings


@pytest.mark.parametrize(("family", "text"), [(f, t) for f in FAMILIES for t in SAME[f]])
def test_same_reading_as_vllm(reference: dict, family: str, text: str) -> None:
    whole = ours(family, text)
    for reading in theirs(reference, family, text):
        assert {"content": whole["content"], "calls": whole["calls"]} == reading, text


@pytest.mark.parametrize(("family", "case"), [(f, d) for f in FAMILIES for d in DIFFERS[f]])
def test_known_differences_from_vllm(reference: dict, family: str, case: Differs) -> None:
    content, calls = case.ours
    assert ours(family, case.text) == {
        "content": content.strip(),
        "calls": calls,
        "malformed": case.malformed,
    }
    content, calls = case.vllm
    for reading in theirs(reference, family, case.text):
        assert reading == {"content": content.strip(), "calls": calls}, case.why


@pytest.mark.parametrize(("family", "text"), all_texts())
def test_streamed_in_any_pieces_equals_whole(family: str, text: str) -> None:
    whole = ours(family, text)
    for pieces in splits(text):
        assert ours(family, text, pieces) == whole, pieces
