"""Qwen3-Coder XML and GLM tool-call parsing: calls, schema typing, malformed blocks, any split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harnessrl.gateway.parsers.tools.base import ContentEvent, ToolCallEvent, collect
from harnessrl.gateway.parsers.tools.glm import GlmToolParser
from harnessrl.gateway.parsers.tools.qwen_xml import QwenXmlToolParser
from harnessrl.gateway.parsers.tools.schema_values import coerce_value

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
                    "mode": {"enum": [1, 2]},
                    "any": {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
                    "odd": {"type": "widget"},
                    "free": {},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm_call(name: str, **params: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in params.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


def parse(cls: type, text: str, pieces: list[str] | None = None, tools: Any = TOOLS) -> dict[str, Any]:
    parser = cls(tools)
    events = [e for piece in (pieces if pieces is not None else [text]) for e in parser.feed(piece)]
    message = collect(events + parser.finish())
    return {
        "content": message.content,
        "calls": [(c.name, json.loads(c.arguments)) for c in message.tool_calls],
        "malformed": parser.malformed,
    }


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every position, and character by character."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


def assert_any_split_same(cls: type, text: str) -> dict[str, Any]:
    whole = parse(cls, text)
    for pieces in splits(text):
        assert parse(cls, text, pieces) == whole, pieces
    return whole


BOTH = pytest.mark.parametrize(("cls", "call"), [(QwenXmlToolParser, qwen_call), (GlmToolParser, glm_call)])


@BOTH
def test_one_call_with_content_before_and_after(cls: type, call: Any) -> None:
    text = f"Let me look.\n{call('run', cmd='ls -la')}\nDone."
    assert assert_any_split_same(cls, text) == {
        "content": "Let me look.\n\nDone.",
        "calls": [("run", {"cmd": "ls -la"})],
        "malformed": 0,
    }


@BOTH
def test_several_calls_unicode_and_nested_json(cls: type, call: Any) -> None:
    text = (
        call("run", cmd='echo "héllo 世界 🚀"', env='{"A": {"b": [1, 2, {"c": null}]}, "Ω": "ü"}')
        + "\n"
        + call("noop")
        + call("run", args='[["x", 1], {"y": true}]', timeout="30")
    )
    result = assert_any_split_same(cls, text)
    assert result["content"] is None and result["malformed"] == 0
    assert result["calls"] == [
        ("run", {"cmd": 'echo "héllo 世界 🚀"', "env": {"A": {"b": [1, 2, {"c": None}]}, "Ω": "ü"}}),
        ("noop", {}),
        ("run", {"args": [["x", 1], {"y": True}], "timeout": 30}),
    ]
    parser = cls(TOOLS)
    arguments = [
        e.call.arguments for e in parser.feed(text) + parser.finish() if isinstance(e, ToolCallEvent)
    ]
    assert "世界" in arguments[0]  # serialized with ensure_ascii=False


@BOTH
def test_values_are_typed_by_the_schema(cls: type, call: Any) -> None:
    text = call(
        "run",
        cmd="42",
        timeout="7",
        ratio="3.0",
        force="true",
        maybe="null",
        mode="2",
        any="1",
        odd='{"k": 1}',
        free="5",
        extra="[1]",
    )
    [(_, args)] = parse(cls, text)["calls"]
    assert args == {
        "cmd": "42",  # a string stays a string
        "timeout": 7,
        "ratio": 3,  # a whole number is written as an int, as vLLM does
        "force": True,
        "maybe": None,
        "mode": 2,  # enum values give the type
        "any": True,  # anyOf: boolean is tried before string
        "odd": {"k": 1},  # an unknown type: JSON when it is JSON
        "free": "5",  # a schema without a type: text
        "extra": "[1]",  # not in the schema: text
    }


@BOTH
def test_without_tools_every_value_is_text(cls: type, call: Any) -> None:
    assert parse(cls, call("run", timeout="7", env="{}"), tools=None)["calls"] == [
        ("run", {"timeout": "7", "env": "{}"})
    ]


@BOTH
def test_a_value_that_does_not_fit_its_type_stays_text(cls: type, call: Any) -> None:
    [(_, args)] = parse(cls, call("run", timeout="soon", force="maybe", env="{bad"))["calls"]
    assert args == {"timeout": "soon", "force": "maybe", "env": "{bad"}


def test_coerce_value_follows_vllm_rules() -> None:
    assert coerce_value(" 1_000 ", {"type": "integer"}) == 1000  # Python's int(), as vLLM
    assert coerce_value("1.5", {"type": "integer"}) == 1.5  # no type fits: JSON
    assert coerce_value("inf", {"type": "number"}) == "inf"  # not JSON-serializable: text
    assert coerce_value("[1e999]", {"type": "array"}) == "[1e999]"
    assert coerce_value("0", {"type": "bool"}) is False  # vLLM's type aliases
    assert coerce_value('"quoted"', {"type": "widget"}) == "quoted"
    deep = "[" * 100_000
    assert coerce_value(deep, {"type": "array"}) == deep  # too deep to parse: text, no RecursionError


def test_qwen_multiline_values_lose_only_the_template_newlines() -> None:
    text = "<tool_call>\n<function=run>\n<parameter=cmd>\n\ncat <<EOF\n  a\nEOF\n\n</parameter>\n</function>\n</tool_call>"
    assert assert_any_split_same(QwenXmlToolParser, text)["calls"] == [
        ("run", {"cmd": "\ncat <<EOF\n  a\nEOF\n"})
    ]
    inline = "<tool_call><function=run><parameter=cmd>ls</parameter></function></tool_call>"
    assert parse(QwenXmlToolParser, inline)["calls"] == [("run", {"cmd": "ls"})]


def test_glm_values_keep_their_newlines_and_glm47_needs_none() -> None:
    text = "<tool_call>run<arg_key>cmd</arg_key><arg_value>\nline 1\nline 2\n</arg_value></tool_call>"
    assert assert_any_split_same(GlmToolParser, text)["calls"] == [("run", {"cmd": "\nline 1\nline 2\n"})]


def test_markup_inside_a_value_is_text() -> None:
    qwen = qwen_call("run", cmd="echo '</tool_call> </function> <tool_call>' > x.xml")
    assert parse(QwenXmlToolParser, qwen)["calls"] == [
        ("run", {"cmd": "echo '</tool_call> </function> <tool_call>' > x.xml"})
    ]
    glm = glm_call("run", cmd="a </tool_call> <arg_key>b</arg_key>")
    assert parse(GlmToolParser, glm)["calls"] == [("run", {"cmd": "a </tool_call> <arg_key>b</arg_key>"})]


def test_qwen_several_functions_in_one_block() -> None:
    text = "<tool_call>\n<function=noop>\n</function>\n<function=run>\n<parameter=timeout>\n1\n</parameter>\n</function>\n</tool_call>"
    assert parse(QwenXmlToolParser, text)["calls"] == [("noop", {}), ("run", {"timeout": 1})]


QWEN_MALFORMED = [
    "<tool_call>\n</tool_call>",  # no function
    "<tool_call>\n<function=>\n</function>\n</tool_call>",  # no name
    "<tool_call>\n<function=two words>\n</function>\n</tool_call>",
    "<tool_call>\nI will call it.<function=run>\n</function>\n</tool_call>",  # text in the block
    "<tool_call>\n<function=run>\nnote\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=run>\n<parameter=>\nls\n</parameter>\n</function>\n</tool_call>",  # no key
    "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>",  # no </function>
    "<tool_call>\n<function=run\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",  # no '>'
]
GLM_MALFORMED = [
    "<tool_call>\n</tool_call>",  # no name
    "<tool_call>I think\nso</tool_call>",  # prose, not a name
    "<tool_call>run\n<arg_value>ls</arg_value>\n</tool_call>",  # a value without a key
    "<tool_call>run\n<arg_key>cmd</arg_key>\nls\n</tool_call>",  # a key without a value
    "<tool_call>run\n<arg_key></arg_key><arg_value>ls</arg_value></tool_call>",  # empty key
    "<tool_call>run\n<arg_key>cmd</arg_key><arg_value>ls</arg_value>junk</tool_call>",
    "<tool_call>run<arg_key>c<md</arg_key><arg_value>ls</arg_value></tool_call>",
]
TRUNCATED = {
    QwenXmlToolParser: [
        "<tool_call>",
        "<tool_call>\n<function=ru",
        "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la",
        "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_",
    ],
    GlmToolParser: [
        "<tool_call>run",
        "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls -la",
        "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n",
    ],
}
CASES = [(QwenXmlToolParser, t) for t in QWEN_MALFORMED] + [(GlmToolParser, t) for t in GLM_MALFORMED]
CASES += [(cls, t) for cls, texts in TRUNCATED.items() for t in texts]


@pytest.mark.parametrize(("cls", "text"), CASES)
def test_malformed_or_truncated_blocks_are_text_and_counted(cls: type, text: str) -> None:
    assert assert_any_split_same(cls, "Before. " + text) == {
        "content": "Before. " + text,
        "calls": [],
        "malformed": 1,
    }


@BOTH
def test_a_good_block_after_a_broken_one_is_still_a_call(cls: type, call: Any) -> None:
    text = "<tool_call>oops <tool_call> " + call("noop") + " <tool_call>\n</tool_call>"
    result = assert_any_split_same(cls, text)
    assert result["calls"] == [("noop", {})]
    assert result["malformed"] == 3
    assert result["content"] == "<tool_call>oops <tool_call>  <tool_call>\n</tool_call>".strip()


@BOTH
def test_content_is_released_as_soon_as_it_cannot_be_a_tag(cls: type, call: Any) -> None:
    parser = cls(TOOLS)
    assert parser.feed("a < b and <tool") == [ContentEvent("a < b and ")]
    assert parser.feed("box>") == [ContentEvent("<toolbox>")]
    assert parser.feed(call("noop")[:-3]) == []  # inside a block nothing comes out until it closes
    assert [type(e) for e in parser.feed("ll>")] == [ToolCallEvent]
    assert parser.finish() == []


TEXT_ALPHABET = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<function=run>",
        "<function=",
        "</function>",
        "<parameter=cmd>",
        "</parameter>",
        "<arg_key>",
        "cmd",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "\n",
        " ",
        "<",
        ">",
        "ls",
        "7",
        "{",
        "世",
    ]
)


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(TEXT_ALPHABET, max_size=30), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_any_text_in_any_pieces_never_raises_and_equals_whole(parts: list[str], cuts: list[int]) -> None:
    text = "".join(parts)
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    for cls in (QwenXmlToolParser, GlmToolParser):
        whole = parse(cls, text)
        assert parse(cls, text, pieces) == whole
        if not whole["calls"]:
            assert whole["content"] == text  # nothing is lost: no call, all text
