"""Samples per rollout: harnessrl's builder (gateway sampled-token reuse) vs the Agent Lightning rule.

Roadmap issue 3. Multi-turn traces are recorded through the **real gateway** (uvicorn on 127.0.0.1,
SQLite store in a temporary folder), driven by an ordinary append-only agent loop written with the
official ``openai`` SDK: it keeps its message list, appends each assistant message as returned and
appends tool results (generated shell-like outputs: file listings, pytest failures with tracebacks,
grep hits, JSON blobs, diffs, unicode, long lines). Two trace families:

- ``sampled``: the embedded engine (``--model tiny`` by default: a random Qwen3-architecture model with a
  real byte-level BPE tokenizer) sampling at T=1.0 with a small ``max_tokens``. Sampled token
  sequences are often not what the tokenizer would produce for their text (decoding is not
  injective), and the answer text is what the harness sends back.
- ``tool_calling``: a scripted policy emitting Hermes tool calls (and sometimes ``<think>`` text), and a
  harness that re-serializes tool-call arguments compactly (``json.dumps(..., separators=(",", ":"))``,
  as OpenCode / Qwen Code do) and sometimes sends assistant content back as a list of text parts
  (tool-call handlers normalize the response).
- ``reasoning``: the same scripted tool-calling policy on a Qwen3-style chat template (the tiny
  vocabulary with ``tests/fixtures/chat_templates/qwen3_style.jinja``: earlier turns' reasoning is
  dropped from the render), every tool-calling turn with ``<think>`` text and ~40% with two parallel
  calls; the harness sends each turn back as litellm does (reasoning moved to
  ``reasoning_content``), without its reasoning, or verbatim, and half the rollouts send command
  output as a user message (mini-swe-agent's way).

For every rollout the calls are read back from the gateway's control API and counted two ways:

(a) ``harnessrl``: ``build_batch`` over the recorded calls (prompt IDs as the gateway built them, with
    sampled-token reuse);
(b) ``agl_rule``: each call's request messages, as received, retokenized with the chat template
    (``render_chat(..., add_generation_prompt=True)`` + ``encode``) — what a proxy that does not reuse
    sampled IDs feeds its engine — and call k+1 merged into the current sample only if that prompt
    starts with the sample's tokens so far (retokenized prompt + response IDs), else a new sample.
    ``agl_rule_parsed_arguments`` is the same after parsing string tool-call arguments into objects
    before rendering (what vLLM's chat endpoint does), reported because it changes which drift counts.

Usage: ``.venv/bin/python benchmarks/merge_rate.py [--rollouts N] [--quick] [--model tiny|smollm2]``.
Writes ``benchmarks/results/merge_rate.json`` (``--out`` to change). Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

import harnessrl
from harnessrl.client import GatewayClient
from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.engines.base import Engine, GenerationContext, Samples, SamplingParams, WeightUpdate
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trajectory import BREAK_REASONS, build_batch, build_rollout_samples

ADMIN_KEY = "merge-rate-benchmark"  # a throwaway key for a gateway that only listens on 127.0.0.1
RESULTS = Path(__file__).resolve().parent / "results" / "merge_rate.json"
QWEN3_STYLE_TEMPLATE = Path(__file__).resolve().parents[1] / "tests/fixtures/chat_templates/qwen3_style.jinja"
FAMILIES = ("sampled", "tool_calling", "reasoning")
GOAL = 1.1  # samples per rollout on append-only traces (roadmap issue 3)
AGL_REPORTED = 2.41  # Agent Lightning v1.0's reported samples per rollout with exact-prefix merging

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View or edit a file: replace old_str (unique) with new_str.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "str_replace", "create"]},
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search files for a regular expression.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "include": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
]

SYSTEM_PROMPT = (
    "You are a software engineering agent working in a Python repository at /testbed. Fix the issue "
    "described by the user. Use the tools to inspect files and run commands; run the tests before you "
    "finish. Reply with a short summary when you are done."
)

# --- realistic tool outputs ------------------------------------------------------------------------

_FILES = [
    "src/config/loader.py",
    "src/config/__init__.py",
    "src/cli.py",
    "src/utils/paths.py",
    "tests/test_loader.py",
    "tests/conftest.py",
    "README.md",
    "pyproject.toml",
    "docs/usage.rst",
    "src/données/schéma.py",
]
_WORDS = [
    *("config", "value", "path", "loader", "parse", "default", "section", "key", "missing", "error"),
    *("raise", "return", "import", "module", "cache", "timeout", "retry", "encoding", "unicode"),
    *("fallback", "environment", "override", "merge"),
]
_UNICODE = [
    "café",
    "naïve",
    "Zürich",
    "日本語のテスト",
    "данные",
    "→ ✓ ✗",
    "🙂",
    "Ελληνικά",
    "ﬁle",
    "e\u0301",
]


def _sentence(rng: random.Random, lo: int = 4, hi: int = 14) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def _ls_output(rng: random.Random) -> str:
    lines = [f"total {rng.randint(20, 400)}"]
    for _ in range(rng.randint(4, 18)):
        name = (
            rng.choice(_FILES).split("/")[-1]
            if rng.random() < 0.7
            else rng.choice(_WORDS) + rng.choice(["", "/"])
        )
        perms = rng.choice(["-rw-r--r--", "drwxr-xr-x", "-rwxr-xr-x"])
        size = rng.randint(0, 90000)
        month = rng.choice(["Jan", "Mar", "Jun", "Oct"])
        date = f"{month} {rng.randint(1, 28):2d} {rng.randint(10, 23)}:{rng.randint(0, 59):02d}"
        lines.append(f"{perms}  1 root root {size:>6} {date} {name}")
    return "\n".join(lines)


def _pytest_failure(rng: random.Random) -> str:
    test = f"test_{rng.choice(_WORDS)}_{rng.choice(_WORDS)}"
    line = rng.randint(10, 300)
    key = rng.choice(_WORDS)
    out = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /testbed",
        f"collected {rng.randint(3, 120)} items",
        "",
        f"tests/test_loader.py {'.' * rng.randint(1, 20)}F{'.' * rng.randint(0, 9)}{' ' * 20}[100%]",
        "",
        "=================================== FAILURES ===================================",
        f"_______________________________ {test} ________________________________",
        "",
        f"    def {test}(tmp_path):",
        '        cfg = tmp_path / "settings.toml"',
        f'        cfg.write_text("[{key}]\\nvalue = \'{rng.choice(_UNICODE)}\'\\n", encoding="utf-8")',
        '>       assert load(cfg)["value"] == EXPECTED',
        "",
        f"tests/test_loader.py:{line}: ",
        "_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _",
        f"src/config/loader.py:{rng.randint(10, 200)}: in load",
        "    return _merge(defaults, parsed)",
        f"src/config/loader.py:{rng.randint(10, 200)}: in _merge",
        "    out[k] = v if k not in base else base[k] | v",
        f"E   KeyError: '{key}'",
        "",
        "=========================== short test summary info ============================",
        f"FAILED tests/test_loader.py::{test} - KeyError: '{key}'",
        f"{'=' * 25} 1 failed, {rng.randint(2, 80)} passed in {rng.uniform(0.1, 9):.2f}s {'=' * 25}",
    ]
    return "\n".join(out)


def _grep_hits(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(1, 12)):
        path = rng.choice(_FILES)
        code = rng.choice(
            [
                f"def {rng.choice(_WORDS)}_{rng.choice(_WORDS)}(self, {rng.choice(_WORDS)}=None):",
                f'    raise ValueError(f"missing {{{rng.choice(_WORDS)}!r}}")',
                f"from .{rng.choice(_WORDS)} import {rng.choice(_WORDS).capitalize()}",
                f"    # TODO({rng.choice(['ana', 'björn', 'wei'])}): {_sentence(rng, 3, 8)}",
                f'    return os.environ.get("{rng.choice(_WORDS).upper()}", {rng.randint(0, 99)})',
            ]
        )
        lines.append(f"{path}:{rng.randint(1, 900)}:{code}")
    return "\n".join(lines)


def _json_blob(rng: random.Random) -> str:
    def value(depth: int) -> Any:
        kind = rng.random()
        if depth > 2 or kind < 0.35:
            return rng.choice(
                [rng.randint(-5, 10**6), rng.random(), rng.choice(_UNICODE), None, True, _sentence(rng)]
            )
        if kind < 0.7:
            return {rng.choice(_WORDS) + str(i): value(depth + 1) for i in range(rng.randint(1, 5))}
        return [value(depth + 1) for _ in range(rng.randint(0, 4))]

    blob = {"status": rng.choice(["ok", "error"]), "data": value(0)}
    return json.dumps(blob, indent=rng.choice([None, 2]), ensure_ascii=rng.random() < 0.5)


def _diff(rng: random.Random) -> str:
    path = rng.choice(_FILES)
    return "\n".join(
        [
            f"diff --git a/{path} b/{path}",
            f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
            f"--- a/{path}",
            f"+++ b/{path}",
            f"@@ -{rng.randint(1, 90)},7 +{rng.randint(1, 90)},8 @@ def load(path):",
            '     text = Path(path).read_text(encoding="utf-8")',
            "-    parsed = tomllib.loads(text)",
            '+    parsed = tomllib.loads(text.lstrip("\\ufeff"))',
            f"+    # {rng.choice(_UNICODE)}: {_sentence(rng, 3, 7)}",
            "     return _merge(DEFAULTS, parsed)",
        ]
    )


def _long_line(rng: random.Random) -> str:
    # Minified JS / a CSV row / a log line without newlines: long runs the tokenizer must split.
    kind = rng.choice(["js", "csv", "log"])
    if kind == "js":
        return "".join(
            f"function {rng.choice(_WORDS)}(a,b){{return a.{rng.choice(_WORDS)}(b)||{rng.randint(0, 9)}}};"
            for _ in range(rng.randint(8, 30))
        )
    if kind == "csv":
        return ",".join(
            f'"{rng.choice(_UNICODE)}"' if rng.random() < 0.2 else str(rng.randint(0, 99999))
            for _ in range(rng.randint(30, 120))
        )
    return " ".join(
        f"[{rng.choice(['INFO', 'WARN', 'DEBUG'])}] {rng.choice(_WORDS)}={rng.random():.6f}"
        for _ in range(rng.randint(10, 40))
    )


def _python_traceback(rng: random.Random) -> str:
    return "\n".join(
        [
            "Traceback (most recent call last):",
            f'  File "/testbed/src/cli.py", line {rng.randint(5, 99)}, in <module>',
            "    main()",
            f'  File "/testbed/src/config/loader.py", line {rng.randint(5, 300)}, in load',
            "    with open(path, encoding=enc) as fh:",
            f"UnicodeDecodeError: 'ascii' codec can't decode byte 0x{rng.randint(128, 255):x} "
            f"in position {rng.randint(0, 4000)}: ordinal not in range(128)",
        ]
    )


def _cat_file(rng: random.Random) -> str:
    lines = ['"""' + _sentence(rng) + '"""', "", "from __future__ import annotations", "", "import os", ""]
    for i in range(rng.randint(3, 25)):
        lines.append(
            f"{i + 1:>4}\t"
            + rng.choice(
                [
                    f"def {rng.choice(_WORDS)}({rng.choice(_WORDS)}: str) -> dict[str, object]:",
                    f"    {rng.choice(_WORDS)} = {rng.choice(_WORDS)}.get({rng.choice(_WORDS)!r}, {{}})",
                    f"    return {{k: v for k, v in {rng.choice(_WORDS)}.items() if v is not None}}",
                    f"\t\t# mixed\ttabs   and  spaces   {rng.choice(_UNICODE)}",
                    "",
                ]
            )
        )
    return "\n".join(lines)


_OUTPUTS = [
    _ls_output,
    _pytest_failure,
    _grep_hits,
    _json_blob,
    _diff,
    _long_line,
    _python_traceback,
    _cat_file,
]


def tool_output(rng: random.Random) -> str:
    """One realistic tool result; sometimes empty, sometimes two outputs glued (a command chain)."""
    if rng.random() < 0.04:
        return ""
    out = rng.choice(_OUTPUTS)(rng)
    if rng.random() < 0.15:
        out += "\n" + rng.choice(_OUTPUTS)(rng)
    return out


def observation(rng: random.Random) -> str:
    """A mini-swe-agent-style observation: the harness runs the command it parsed out of the text."""
    return (
        f"<returncode>{rng.choice([0, 0, 1, 2, 127])}</returncode>\n<output>\n{tool_output(rng)}\n</output>"
    )


# --- the scripted tool-calling policy ---------------------------------------------------------------


def _tool_call(rng: random.Random) -> dict[str, Any]:
    kind = rng.random()
    if kind < 0.45:
        command = rng.choice(
            [
                "python -m pytest tests/test_loader.py -x -q",
                "ls -la src/config",
                "git diff",
                'grep -rn "def load" src/ | head -20',
                "cat src/config/loader.py | sed -n '1,80p'",
                "python -c 'import sys; print(sys.version)'",
                f"echo '{rng.choice(_UNICODE)}' > /tmp/x.txt && file /tmp/x.txt",
                "find . -name '*.py' -newer setup.cfg | xargs wc -l",
            ]
        )
        name, arguments = "bash", {"command": command}
    elif kind < 0.8:
        old = f"    parsed = tomllib.loads(text)\n    return _merge({rng.choice(_WORDS).upper()}, parsed)"
        new = (
            f'    parsed = tomllib.loads(text.lstrip("\\ufeff"))  # {rng.choice(_UNICODE)}\n'
            "    return _merge(DEFAULTS, parsed)"
        )
        name = "str_replace_editor"
        arguments = {"command": "str_replace", "path": rng.choice(_FILES), "old_str": old, "new_str": new}
        if rng.random() < 0.3:
            arguments = {
                "command": "view",
                "path": rng.choice(_FILES),
                "view_range": [1, rng.randint(20, 200)],
            }
    else:
        name, arguments = "grep", {"pattern": rf"def \w+_{rng.choice(_WORDS)}\(", "include": "*.py"}
    # How the model writes the arguments: mostly like json.dumps (what Qwen-style models emit), sometimes
    # compact or pretty-printed. The scripted engine writes string arguments verbatim.
    style = rng.random()
    if style < 0.15:
        return {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)}
    if style < 0.22:
        return {"name": name, "arguments": json.dumps(arguments, indent=2, ensure_ascii=False)}
    return {"name": name, "arguments": arguments}


def scripted_turns(rng: random.Random, turns: int, *, reasoning: bool = False) -> list[dict[str, Any]]:
    """A rollout's assistant turns: ``turns - 1`` tool-calling turns, then a final text answer.
    ``reasoning``: every turn thinks first and ~40% of tool turns make two parallel calls."""
    out: list[dict[str, Any]] = []
    for _ in range(turns - 1):
        turn: dict[str, Any] = {
            "content": rng.choice(
                [
                    "",
                    "",
                    "Let me look at the failing test first.",
                    f"I'll check `{rng.choice(_FILES)}`.",
                    _sentence(rng, 6, 20),
                    f"Vérifions: {rng.choice(_UNICODE)} — {_sentence(rng, 3, 6)}",
                    "The traceback points at `_merge`:\n\n```python\nout[k] = base[k] | v\n```\n\n"
                    "That fails when `k` is missing.",
                ]
            ),
            "tool_calls": [
                _tool_call(rng) for _ in range(1 if rng.random() < (0.6 if reasoning else 0.85) else 2)
            ],
        }
        if reasoning or rng.random() < 0.3:
            turn["reasoning"] = _sentence(rng, 8, 30)
        out.append(turn)
    summary = f"Done. {_sentence(rng, 5, 15)} The tests in `tests/test_loader.py` pass now ✓."
    out.append({"content": summary, **({"reasoning": _sentence(rng, 6, 20)} if reasoning else {})})
    return out


class PerRolloutScriptedEngine:
    """The ``Engine`` protocol with one script per rollout (``ScriptedEngine`` replays one script for all)."""

    def __init__(self, tokenizer: PolicyTokenizer, context_length: int = 32768) -> None:
        self._tokenizer = tokenizer
        self._context_length = context_length
        self._scripts: dict[str, ScriptedEngine] = {}
        self._version = 0

    def add(self, rollout_id: str, turns: list[dict[str, Any]]) -> None:
        self._scripts[rollout_id] = ScriptedEngine(
            turns, self._tokenizer, context_length=self._context_length
        )

    @property
    def model_name(self) -> str:
        return "scripted"

    @property
    def tokenizer(self) -> PolicyTokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def policy_version(self) -> int:
        return self._version

    async def start(self) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        assert context is not None and context.rollout_id in self._scripts, "every rollout needs a script"
        return self._scripts[context.rollout_id].generate(prompt_ids, params, context)

    async def update_weights(self, update: WeightUpdate) -> None:
        self._version = update.version

    async def health(self) -> dict[str, Any]:
        return {"engine": "scripted-per-rollout", "scripts": len(self._scripts)}


# --- the append-only harness -------------------------------------------------------------------------


@dataclass
class HarnessPlan:
    """How one rollout's harness behaves (drawn per rollout, so the families mix harness styles)."""

    family: str
    turns: int
    stream: bool
    tools: bool
    max_tokens: int | None
    reserialize_arguments: bool  # OpenCode / Qwen Code: json.dumps(json.loads(args), separators=(",", ":"))
    parts_content: float  # probability of sending an assistant message's content as [{"type": "text", ...}]
    seed: int
    # How a turn's <think> block goes back: "verbatim", "litellm" (moved to reasoning_content), "dropped".
    reasoning_back: str = "verbatim"
    observations_as_user: bool = False  # mini-swe-agent: command output is a user message


@dataclass
class RolloutRecord:
    rollout: Rollout
    calls: list[Call]
    plan: HarnessPlan


async def _complete(
    client: openai.AsyncOpenAI, stream: bool, **kwargs: Any
) -> tuple[str | None, list[dict[str, Any]], int]:
    """One chat call: (content, tool_calls as plain dicts, prompt + completion tokens)."""
    if not stream:
        resp = await client.chat.completions.create(**kwargs)
        msg = resp.choices[0].message
        calls = [c.model_dump(exclude_none=True) for c in msg.tool_calls or []]
        return msg.content, calls, resp.usage.total_tokens if resp.usage else 0
    # What streaming SDK loops do: concatenate content deltas, assemble tool calls by index.
    content: list[str] = []
    calls_by_index: dict[int, dict[str, Any]] = {}
    total = 0
    events = await client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **kwargs
    )
    async for chunk in events:
        if chunk.usage:
            total = chunk.usage.total_tokens
        for choice in chunk.choices:
            if choice.delta.content:
                content.append(choice.delta.content)
            for tc in choice.delta.tool_calls or []:
                entry = calls_by_index.setdefault(
                    tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["id"] = tc.id or entry["id"]
                if tc.function is not None:
                    entry["function"]["name"] += tc.function.name or ""
                    entry["function"]["arguments"] += tc.function.arguments or ""
    text = "".join(content)
    return (text or None), [calls_by_index[i] for i in sorted(calls_by_index)], total


async def run_harness(base_url: str, api_key: str, plan: HarnessPlan, context_length: int) -> int:
    """Drive one rollout like an ordinary OpenAI-SDK agent that only appends to its history; returns calls."""
    rng = random.Random(plan.seed)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600.0)
    problem = _sentence(rng, 6, 16)
    task = f"{problem} Loading `{rng.choice(_FILES)}` fails with a KeyError ({rng.choice(_UNICODE)})."
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
    calls = 0
    try:
        for turn in range(plan.turns):
            kwargs: dict[str, Any] = {
                "model": "policy-under-training",
                "messages": messages,
                "temperature": 1.0,
            }
            if plan.max_tokens is not None:
                kwargs["max_tokens"] = plan.max_tokens
            if plan.tools:
                kwargs["tools"] = TOOLS
            content, tool_calls, used = await _complete(client, plan.stream, **kwargs)
            calls += 1
            assistant: dict[str, Any] = {"role": "assistant", "content": content}
            if content and "</think>" in content and plan.reasoning_back != "verbatim":
                thought, _, content = content.partition("</think>")
                assistant["content"] = content
                if plan.reasoning_back == "litellm":
                    assistant["reasoning_content"] = thought.removeprefix("<think>")
            if content and rng.random() < plan.parts_content:
                assistant["content"] = [{"type": "text", "text": content}]
            if tool_calls:
                if plan.reserialize_arguments:
                    for tc in tool_calls:
                        fn = tc["function"]
                        fn["arguments"] = json.dumps(json.loads(fn["arguments"]), separators=(",", ":"))
                assistant["tool_calls"] = tool_calls
            messages.append(assistant)
            if plan.family in ("tool_calling", "reasoning") and not tool_calls:
                break  # the agent answered in text: the episode is over
            if turn == plan.turns - 1:
                break
            if tool_calls and plan.observations_as_user:
                outputs = "\n\n".join(tool_output(rng) for _ in tool_calls)
                results = [{"role": "user", "content": f"Observation:\n{outputs}"}]
            elif tool_calls:
                results = [
                    {"role": "tool", "tool_call_id": tc["id"], "content": tool_output(rng)}
                    for tc in tool_calls
                ]
            else:
                results = [{"role": "user", "content": observation(rng)}]
            # Harnesses stop before overflowing the context; characters / 2 over-estimates tokens here.
            grow = sum(len(m["content"]) for m in results) // 2 + 64 + (plan.max_tokens or 512)
            if used + grow > context_length:
                break
            messages.extend(results)
    finally:
        await client.close()
    return calls


# --- recording a family through the real gateway ---------------------------------------------------


@dataclass
class FamilyTraces:
    family: str
    records: list[RolloutRecord]
    tokenizer: PolicyTokenizer
    model: str
    reuse_counts: dict[str, float] = field(default_factory=dict)
    record_s: float = 0.0


def _plans(family: str, n: int, seed: int, quick: bool) -> list[HarnessPlan]:
    rng = random.Random(f"{family}:{seed}")
    plans = []
    for i in range(n):
        sampled = family == "sampled"
        plans.append(
            HarnessPlan(
                family=family,
                turns=rng.randint(3, 4) if quick else rng.randint(4, 10),
                stream=rng.random() < 0.5,
                tools=rng.random() < 0.5 if sampled else True,
                max_tokens=(rng.randint(8, 16) if quick else rng.randint(24, 48)) if sampled else None,
                reserialize_arguments=not sampled,
                # Content parts only where the template takes them (Qwen3's reads content as text).
                parts_content=0.3 if family == "tool_calling" else 0.0,
                seed=rng.getrandbits(32) + i,
                reasoning_back=rng.choice(["litellm", "dropped", "verbatim"])
                if family == "reasoning"
                else "verbatim",
                observations_as_user=family == "reasoning" and rng.random() < 0.5,
            )
        )
    return plans


def _reuse_counts(metrics_text: str) -> dict[str, float]:
    """``harnessrl_prompt_reuse_total{result=...}`` from the gateway's Prometheus text."""
    counts: dict[str, float] = {}
    for m in re.finditer(r'^harnessrl_prompt_reuse_total\{result="(\w+)"\} ([0-9.e+]+)$', metrics_text, re.M):
        counts[m.group(1)] = float(m.group(2))
    return counts


def qwen3_style_tokenizer(folder: Path) -> PolicyTokenizer:
    """The tiny model's vocabulary with Qwen3's reasoning template (earlier reasoning dropped)."""
    source = tiny_model_dir(weights=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(source / name, folder / name)
    shutil.copy(QWEN3_STYLE_TEMPLATE, folder / "chat_template.jinja")
    return PolicyTokenizer.from_dir(folder)


def _make_engine(family: str, model: str, seed: int, folder: Path) -> tuple[Engine, str]:
    if family == "tool_calling":
        return PerRolloutScriptedEngine(PolicyTokenizer.from_dir(tiny_model_dir(weights=False))), "scripted"
    if family == "reasoning":
        return PerRolloutScriptedEngine(qwen3_style_tokenizer(folder)), "scripted (qwen3-style template)"
    from harnessrl.engines.factory import create_engine

    return create_engine(EngineConfig(model=model, seed=seed, max_batch_size=16)), model


@contextlib.contextmanager
def _gateway(engine: Engine, folder: Path) -> Iterator[tuple[GatewayClient, SQLiteStore]]:
    store = SQLiteStore(folder / "harnessrl.db")
    try:
        app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
        with (
            serve_in_thread(app, host="127.0.0.1", timeout_s=300.0) as url,
            GatewayClient(url, ADMIN_KEY) as client,
        ):
            client.wait_ready(timeout=300.0)
            yield client, store
    finally:
        store.close()


def record_family(
    family: str,
    rollouts: int,
    *,
    seed: int = 0,
    model: str = "tiny",
    quick: bool = False,
    concurrency: int = 8,
) -> FamilyTraces:
    """Run ``rollouts`` harness episodes of ``family`` through a fresh gateway; return the stored calls."""
    started = time.perf_counter()
    plans = _plans(family, rollouts, seed, quick)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"merge-rate-{family}-")))
        (tmp / "model").mkdir()
        engine, model_name = _make_engine(family, model, seed, tmp / "model")
        client, store = stack.enter_context(_gateway(engine, tmp))
        context_length = int(client.health()["context_length"])
        created = [client.create_rollout({"prompt": f"{family} {i}"}, group=family) for i in range(rollouts)]
        if isinstance(engine, PerRolloutScriptedEngine):
            for plan, rollout in zip(plans, created, strict=True):
                turns = scripted_turns(random.Random(plan.seed), plan.turns, reasoning=family == "reasoning")
                engine.add(rollout["rollout_id"], turns)

        async def drive_all() -> None:
            gate = asyncio.Semaphore(concurrency)
            done = 0

            async def one(plan: HarnessPlan, rollout: dict[str, Any]) -> None:
                nonlocal done
                async with gate:
                    await run_harness(rollout["base_url"], rollout["api_key"], plan, context_length)
                done += 1
                if done == rollouts or done % max(rollouts // 4, 1) == 0:
                    elapsed = time.perf_counter() - started
                    print(f"[{family}] {done}/{rollouts} rollouts recorded ({elapsed:.0f}s)", file=sys.stderr)

            await asyncio.gather(*(one(p, r) for p, r in zip(plans, created, strict=True)))

        asyncio.run(drive_all())
        records = []
        for plan, rollout in zip(plans, created, strict=True):
            rid = rollout["rollout_id"]
            client.finish_rollout(rid, Outcome.SUCCESS, reward=1.0)
            # Calls through the control API, as the trainer reads them.
            records.append(RolloutRecord(store.get_rollout(rid), client.list_calls(rid), plan))
        reuse = _reuse_counts(client.metrics())
    return FamilyTraces(
        family=family,
        records=records,
        tokenizer=engine.tokenizer,
        model=model_name,
        reuse_counts=reuse,
        record_s=time.perf_counter() - started,
    )


# --- the two merge rules -----------------------------------------------------------------------------


def _parse_arguments(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments JSON strings -> objects, as vLLM's chat endpoint does before rendering."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            message = json.loads(json.dumps(message))
            for tc in message["tool_calls"]:
                fn = tc.get("function", {})
                if isinstance(fn.get("arguments"), str):
                    with contextlib.suppress(json.JSONDecodeError):
                        fn["arguments"] = json.loads(fn["arguments"])
        out.append(message)
    return out


def retokenized_prompt(call: Call, tokenizer: PolicyTokenizer, *, parse_arguments: bool = False) -> list[int]:
    """The prompt a proxy without sampled-token reuse builds: the request's messages, rendered and encoded."""
    messages = call.request["messages"]
    if parse_arguments:
        messages = _parse_arguments(messages)
    kwargs = call.request.get("chat_template_kwargs") or {}
    text = tokenizer.render_chat(
        messages, tools=call.request.get("tools") or None, add_generation_prompt=True, **kwargs
    )
    return tokenizer.encode(text)


def agl_rule_samples(
    calls: Sequence[Call], tokenizer: PolicyTokenizer, *, parse_arguments: bool = False
) -> int:
    """Samples under Agent Lightning's rule: merge into the current sample only on an exact prefix match.

    The current sample's tokens are the retokenized prompt of its last call plus that call's response
    IDs; the next call merges iff its retokenized prompt starts with them. Only the current (previous)
    sample is compared, as in Agent Lightning.
    """
    samples = 0
    head: list[int] | None = None
    for call in sorted(calls, key=lambda c: c.seq):
        if call.api != "chat.completions":
            continue
        prompt = retokenized_prompt(call, tokenizer, parse_arguments=parse_arguments)
        if head is None or prompt[: len(head)] != head:
            samples += 1
        head = prompt + list(call.response_token_ids)
    return samples


def _range(values: list[int | None]) -> list[int] | None:
    """[min, max] of the harness's max_tokens; None when it sends none (generation runs to a stop token)."""
    known = [v for v in values if v is not None]
    return [min(known), max(known)] if known else None


def _share(values: list[int], target: int = 1) -> float:
    return sum(v == target for v in values) / len(values) if values else 0.0


def measure(traces: FamilyTraces) -> dict[str, Any]:
    """Both rules over one family's rollouts, with the builder's break statistics."""
    tok = traces.tokenizer
    pairs = [(r.rollout, r.calls) for r in traces.records]
    batch = build_batch(pairs)
    ours = [len(build_rollout_samples(r, c).samples) for r, c in pairs]
    agl = [agl_rule_samples(c, tok) for _, c in pairs]
    agl_parsed = [agl_rule_samples(c, tok, parse_arguments=True) for _, c in pairs]
    calls = [len(c) for _, c in pairs]
    # Calls whose gateway prompt differs from plain retokenization: where reuse changed what the engine saw.
    differs = sum(
        call.prompt_token_ids != retokenized_prompt(call, tok)
        for _, cs in pairs
        for call in cs
        if call.seq > 0
    )
    later_calls = sum(max(n - 1, 0) for n in calls)
    stats = batch.stats
    n = len(pairs)
    return {
        "rollouts": n,
        "calls": sum(calls),
        "calls_per_rollout": sum(calls) / n if n else 0.0,
        "calls_per_rollout_min_max": [min(calls, default=0), max(calls, default=0)],
        "harnessrl": {
            "samples_per_rollout": stats.samples_per_rollout,
            "single_sample_share": stats.single_sample_share,
            "samples": stats.samples,
            "max_samples_in_a_rollout": max(ours, default=0),
            "breaks": {reason: stats.breaks.get(reason, 0) for reason in BREAK_REASONS},
        },
        "agl_rule": {
            "samples_per_rollout": sum(agl) / n if n else 0.0,
            "single_sample_share": _share(agl),
            "samples": sum(agl),
            "max_samples_in_a_rollout": max(agl, default=0),
        },
        "agl_rule_parsed_arguments": {
            "samples_per_rollout": sum(agl_parsed) / n if n else 0.0,
            "single_sample_share": _share(agl_parsed),
            "samples": sum(agl_parsed),
        },
        "gateway_prompt_reuse": traces.reuse_counts,
        "later_calls_where_reuse_changed_the_prompt": differs,
        "later_calls": later_calls,
        "prompt_tokens_median": statistics.median(
            [len(c.prompt_token_ids) for _, cs in pairs for c in cs] or [0]
        ),
        "finish_reasons": dict(
            sorted(
                {
                    reason: sum(c.finish_reason == reason for _, cs in pairs for c in cs)
                    for reason in {c.finish_reason for _, cs in pairs for c in cs}
                }.items()
            )
        ),
        "harness": {
            "streaming_share": _share([int(r.plan.stream) for r in traces.records]),
            "tools_declared_share": _share([int(r.plan.tools) for r in traces.records]),
            "reserializes_arguments": any(r.plan.reserialize_arguments for r in traces.records),
            "parts_content_probability": traces.records[0].plan.parts_content if traces.records else 0.0,
            "max_tokens_range": _range([r.plan.max_tokens for r in traces.records]),
        },
        "engine": traces.model,
        "record_seconds": round(traces.record_s, 1),
    }


# --- the run -------------------------------------------------------------------------------------------


def _combined(families: dict[str, dict[str, Any]], rule: str) -> float:
    rollouts = sum(f["rollouts"] for f in families.values())
    return sum(f[rule]["samples"] for f in families.values()) / rollouts if rollouts else 0.0


def run_benchmark(
    rollouts: int,
    *,
    seed: int = 0,
    model: str = "tiny",
    quick: bool = False,
    families: Sequence[str] = FAMILIES,
) -> dict[str, Any]:
    started = time.perf_counter()
    measured = {}
    for family in families:
        traces = record_family(family, rollouts, seed=seed, model=model, quick=quick)
        measured[family] = measure(traces)
    ours = _combined(measured, "harnessrl")
    agl = _combined(measured, "agl_rule")
    return {
        "benchmark": "merge_rate",
        "harnessrl_samples_per_rollout": round(ours, 4),
        "agl_rule_samples_per_rollout": round(agl, 4),
        "agl_rule_parsed_arguments_samples_per_rollout": round(
            _combined(measured, "agl_rule_parsed_arguments"), 4
        ),
        "rollouts": sum(f["rollouts"] for f in measured.values()),
        "agl_over_harnessrl": round(agl / ours, 3) if ours else None,
        "goal_harnessrl_samples_per_rollout_at_most": GOAL,
        "goal_met": ours <= GOAL,
        "agl_reported_samples_per_rollout": AGL_REPORTED,
        "families": measured,
        "settings": {
            "rollouts_per_family": rollouts,
            "seed": seed,
            "model": model,
            "quick": quick,
            "temperature": 1.0,
            "concurrency": 8,
            "gateway": "harnessrl gateway (uvicorn, 127.0.0.1), SQLite store, tool_call_parser auto "
            "(hermes), history sampled",
        },
        "versions": {
            "harnessrl": getattr(harnessrl, "__version__", "unknown"),
            "python": platform.python_version(),
            "openai": openai.__version__,
            "platform": platform.platform(),
        },
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "elapsed_seconds": round(time.perf_counter() - started, 1),
        "command": " ".join(["python", "benchmarks/merge_rate.py", *sys.argv[1:]]),
    }


def print_table(result: dict[str, Any]) -> None:
    rows = [
        (
            "family",
            "rollouts",
            "calls/rollout",
            "harnessrl",
            "AGL rule",
            "AGL (parsed args)",
            "1-sample ours/AGL",
        )
    ]
    for name, f in result["families"].items():
        rows.append(
            (
                name,
                str(f["rollouts"]),
                f"{f['calls_per_rollout']:.2f}",
                f"{f['harnessrl']['samples_per_rollout']:.3f}",
                f"{f['agl_rule']['samples_per_rollout']:.3f}",
                f"{f['agl_rule_parsed_arguments']['samples_per_rollout']:.3f}",
                f"{f['harnessrl']['single_sample_share']:.0%} / {f['agl_rule']['single_sample_share']:.0%}",
            )
        )
    rows.append(
        (
            "combined",
            str(result["rollouts"]),
            "",
            f"{result['harnessrl_samples_per_rollout']:.3f}",
            f"{result['agl_rule_samples_per_rollout']:.3f}",
            f"{result['agl_rule_parsed_arguments_samples_per_rollout']:.3f}",
            "",
        )
    )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("samples per rollout (lower is better; 1.0 = every rollout is one training sample)")
    for i, row in enumerate(rows):
        print(
            "  ".join(
                cell.ljust(w) if j == 0 else cell.rjust(w)
                for j, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if i == 0 or i == len(rows) - 2:
            print("  ".join("-" * w for w in widths))
    ratio = result["agl_over_harnessrl"]
    print(
        f"AGL rule / harnessrl: {ratio}x   "
        f"goal harnessrl <= {GOAL}: {'met' if result['goal_met'] else 'NOT met'}"
    )
    for name, f in result["families"].items():
        breaks = {k: v for k, v in f["harnessrl"]["breaks"].items() if v}
        print(
            f"  {name}: harnessrl breaks {breaks or 'none'}; gateway prompt reuse {f['gateway_prompt_reuse']}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rollouts", type=int, default=None, help="rollouts per family (default 48; 6 with --quick)"
    )
    parser.add_argument("--quick", action="store_true", help="few, short rollouts (a smoke run, seconds)")
    parser.add_argument(
        "--model", default="tiny", help="engine model for the sampled family: tiny | smollm2 | a folder"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--family", choices=FAMILIES, action="append", help="run only these")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON result")
    args = parser.parse_args(argv)
    rollouts = args.rollouts or (6 if args.quick else 48)
    families = args.family or list(FAMILIES)
    result = run_benchmark(rollouts, seed=args.seed, model=args.model, quick=args.quick, families=families)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
