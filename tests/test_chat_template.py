"""``chat_template``'s shortcuts render exactly what transformers' sandbox renders.

The reference here is the environment as transformers builds it (``ImmutableSandboxedEnvironment``,
plain ``json.dumps`` for ``tojson``, messages prepared afresh for every render). Every template the
project ships or builds (tiny's ChatML, the Qwen3-style fixture, the Qwen3, Qwen3.6 and DeepSeek
family templates) renders a set of conversations through ``PolicyTokenizer.render_chat`` twice (the
second time from the kept messages, tool lists and JSON) and must match it. Also: what may be kept
and what not (tuples, NaN, non-string keys), a namespace whose JSON changes between two ``tojson``
calls, and the sandbox still refusing what it refused.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from harnessrl.chat_template import (
    TemplateInputs,
    _GenerationTag,
    _raise_exception,
    _strftime_now,
    _TemplateDict,
    _TemplateNamespace,
    compile_chat_template,
    plain,
    template_message,
)
from harnessrl.errors import BadRequest
from harnessrl.tokenizer import PolicyTokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "chat_templates" / "qwen3_style.jinja"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command <b>&</b>",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": []},
        },
    },
    {"type": "function", "function": {"name": "finish", "parameters": {"type": "object", "properties": {}}}},
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "You are an agent. /no_think"},
        {"role": "user", "content": "List files, then say done."},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "The user wants ls.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": {"command": "ls ü"}},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "pwd"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "/work"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nDone.", "name": None},
        {"role": "user", "content": "thanks", "extra": {"nested": [1, 2.5, True, None]}},
    ],
]


def reference_render(
    source: str, messages: list[Any], tools: Any, add_generation_prompt: bool, **kw: Any
) -> str:
    """The render as transformers' environment does it, with nothing kept between renders."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: (
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    )
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_strftime_now,
        dict=_TemplateDict(),
        namespace=_TemplateNamespace,
    )
    return env.from_string(source).render(
        messages=[template_message(m) for m in messages],
        tools=plain(tools),
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **kw,
    )


def _tokenizers() -> dict[str, PolicyTokenizer]:
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.engines.tiny_families import FAMILIES, family_available, tiny_family_dir

    out = {"tiny": PolicyTokenizer.from_dir(tiny_model_dir(weights=False))}
    for name in sorted(FAMILIES):
        if family_available(name) is None:
            out[name] = PolicyTokenizer.from_dir(tiny_family_dir(name, weights=False))
    fixture = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    fixture.chat_template = FIXTURE.read_text()
    out["qwen3_style"] = fixture
    return out


TOKENIZERS = _tokenizers()


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_renders_match_the_plain_sandbox(name: str, with_tools: bool, add_generation_prompt: bool) -> None:
    tok = TOKENIZERS[name]
    tools = TOOLS if with_tools else None
    for messages in CONVERSATIONS:
        want = reference_render(
            tok.get_chat_template(tools), messages, tools, add_generation_prompt, **tok.special_tokens_map
        )
        for _ in range(2):  # the second render takes the kept messages, tool list and JSON
            assert tok.render_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt) == want


def test_only_plain_json_is_kept_by_its_json() -> None:
    inputs = TemplateInputs()
    listed = {"role": "user", "content": "x", "parts": [1, 2]}
    tupled = {"role": "user", "content": "x", "parts": (1, 2)}  # the same JSON as `listed`
    assert inputs.messages([listed])[0]["parts"] == [1, 2]
    assert inputs.messages([tupled])[0]["parts"] == (1, 2)  # not the kept list
    assert inputs.messages([{"role": "user", "content": "x", "n": float("nan")}])[0]["n"] != 0
    with_none = inputs.messages([{"role": "user", "content": "x", "n": None}])[0]
    assert "n" not in with_none  # None values are dropped; a NaN (JSON null too) was not
    assert inputs.messages([{1: "a", "role": "user"}])[0][1] == "a"  # a non-string key: made anew
    assert inputs.messages([listed])[0] is inputs.messages([dict(listed)])[0]  # kept
    with pytest.raises(BadRequest):
        inputs.messages(["not a message"])


def test_tojson_follows_a_namespace_that_changes() -> None:
    template = compile_chat_template(
        "{% set ns = namespace(a=1) %}{{ ns.a | tojson }}{% set ns.a = [2] %}{{ ns.a | tojson }}"
        "{% set d = dict(k=ns.a) %}{{ d | tojson }}{{ d | tojson(indent=1) }}{{ d | tojson }}"
    )
    assert template.render() == '1[2]{"k": [2]}{\n "k": [\n  2\n ]\n}{"k": [2]}'


@pytest.mark.parametrize(
    "source",
    [
        "{{ m.__class__ }}",
        "{{ m._private }}",  # an item, as the sandbox gives it (a dict has no such attribute)
        "{{ m.update({'role': 'x'}) }}",
        "{{ m.items() | list }}",
        "{{ m.get('content') }}|{{ m.role }}|{{ m.missing is defined }}|{{ m.keys | string }}",
        "{{ ms.append(1) }}",
        "{{ m.__init__.__globals__ }}",
        "{% for x in ms %}{{ loop.first }}{{ loop.length }}{{ loop.cycle('a', 'b') }}{{ loop._after }}"
        "{{ loop.__class__ }}{{ loop.missing is defined }}{% endfor %}",
        "{% macro f(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% if caller %}{{ caller() }}{% endif %}"
        "{% endmacro %}{% for x in ms %}{{ f(x) }}{{ f(x, 3, 4, k=5) }}{% call f(x) %}in{% endcall %}{% endfor %}"
        "{{ f.__globals__ }}{{ f._func }}{{ f.name }}",
        "{% macro g() %}{{ m.role }}{% endmacro %}{% set ns = namespace(v=g()) %}{{ ns.v }}{{ g(1) }}",
    ],
)
def test_the_sandbox_answers_as_before(source: str) -> None:
    """Whatever transformers' sandbox renders or refuses, this environment renders or refuses."""
    values = {"m": {"role": "user", "content": "x", "_private": "p"}, "ms": [1]}

    def render(template: jinja2.Template) -> str:
        try:
            return template.render(**values)
        except (jinja2.exceptions.SecurityError, TypeError) as exc:  # refused, or a wrong call
            return f"refused: {type(exc).__name__}: {exc}"

    reference = ImmutableSandboxedEnvironment().from_string(source)
    assert render(compile_chat_template(source)) == render(reference)


def test_what_is_kept_stays_bounded() -> None:
    inputs = TemplateInputs()
    for k in range(TemplateInputs.MAX_MESSAGES + 50):
        assert inputs.messages([{"role": "user", "content": f"m{k}"}])[0]["content"] == f"m{k}"
    for k in range(TemplateInputs.MAX_TOOL_LISTS + 5):
        assert inputs.tools([{"name": f"t{k}"}]) == [{"name": f"t{k}"}]
    assert len(inputs._messages) <= TemplateInputs.MAX_MESSAGES
    assert len(inputs._tools) <= TemplateInputs.MAX_TOOL_LISTS


def test_prepared_tools_render_as_the_tools_themselves() -> None:
    tok = TOKENIZERS["tiny"]
    prepared = tok.template_tools(TOOLS)
    assert tok.template_tools(prepared) is prepared  # a kept form is its own form
    messages = CONVERSATIONS[1]
    assert tok.render_chat(messages, tools=prepared) == tok.render_chat(messages, tools=TOOLS)
    changed = json.loads(json.dumps(TOOLS))
    changed[0]["function"]["name"] = "shell"
    assert "shell" in tok.render_chat(messages, tools=tok.template_tools(changed))


def test_tool_lists_are_looked_up_while_other_threads_keep_new_ones() -> None:
    """Renders run on the event loop and in worker threads at once: asking whether a list is a kept
    form must not iterate the table while another thread changes it ("dictionary changed size
    during iteration" took a call down before)."""
    inputs = TemplateInputs()
    prepared = inputs.tools(TOOLS)
    errors: list[BaseException] = []
    stop = threading.Event()

    def keep_new_lists() -> None:
        k = 0
        while not stop.is_set():
            inputs.tools([{"name": f"t{k}"}])
            k += 1

    def ask_about_the_kept_one() -> None:
        try:
            for _ in range(100_000):
                inputs.tools(prepared)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows within ms
    try:
        churn = threading.Thread(target=keep_new_lists)
        churn.start()
        ask_about_the_kept_one()
        stop.set()
        churn.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
