"""A scripted expert teacher for the assistant example: an OpenAI-compatible chat.completions server.

Offline there is no strong model to distil, so this stands in for one: it answers as a capable model
would through Hermes Agent's file tools. It reads **only the conversation it is sent** — the task's
prompt, the user turn — and parses the instruction with the wording of ``make_tasks.py``'s six
families; it never sees ``hidden.checks``. First call: the ``write_file`` call(s) that do the task
(the folder task: two empty files, as two parallel calls). Once tool results are in the conversation:
a one-sentence final answer. A prompt it does not recognise gets a plain text answer and no tool call
(so such a rollout earns nothing and sft leaves it out).

With network, point ``[engine.teacher]`` at any real provider instead (examples/assistant/README.md,
"Distill, then RL"); nothing else changes.

    python examples/assistant/expert.py --port 8765     # http://127.0.0.1:8765/v1, until Ctrl-C

Serves ``GET /v1/models`` (the gateway probes it at start) and ``POST /v1/chat/completions``, whole or
streamed (``stream: true``: role chunk, content or tool-call deltas, finish chunk, usage chunk when
``stream_options.include_usage``, ``[DONE]``), as an OpenAI-compatible server does.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "assistant-expert"

# One pattern per family of make_tasks.py, written from its prompt templates.
_WORDS = re.compile(
    r"Write a file named (\S+) with exactly (\d+) lines; each line is one of these words: (.+)\.$"
)
_BULLETS = re.compile(
    r"Create (\S+) whose first line is the heading '(# [^']+)', followed by a bullet list "
    r"\('- ' items\), one per line, of: (.+)\.$"
)
_UPPER = re.compile(r"Write the word (\S+) in uppercase letters into (\S+), and nothing else\.$")
_JSON = re.compile(
    r'Create a JSON file (\S+) containing an object with the key "(\w+)" set to the number (\d+)\.$'
)
_COUNTDOWN = re.compile(r"Write (\S+) listing the whole numbers from (\d+) down to (\d+), one per line\.$")
_FOLDER = re.compile(r"Create a folder named (\S+) containing two empty files, (\S+) and (\S+)\.$")


def files_for(prompt: str) -> dict[str, str] | None:
    """The files (path -> content) that fulfil ``prompt``, or None for a prompt it does not know."""
    prompt = prompt.strip()
    if m := _WORDS.match(prompt):
        path, n, words = m[1], int(m[2]), m[3].split(", ")
        return {path: "".join(words[i % len(words)] + "\n" for i in range(n))}
    if m := _BULLETS.match(prompt):
        return {m[1]: m[2] + "\n" + "".join(f"- {item}\n" for item in m[3].split(", "))}
    if m := _UPPER.match(prompt):
        return {m[2]: m[1].upper() + "\n"}
    if m := _JSON.match(prompt):
        return {m[1]: json.dumps({m[2]: int(m[3])}) + "\n"}
    if m := _COUNTDOWN.match(prompt):
        high, low = int(m[2]), int(m[3])
        return {m[1]: "".join(f"{i}\n" for i in range(high, low - 1, -1))}
    if m := _FOLDER.match(prompt):
        return {f"{m[1]}/{m[2]}": "", f"{m[1]}/{m[3]}": ""}
    return None


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


Solver = Callable[[str], "dict[str, str] | None"]


def answer(messages: list[dict[str, Any]], solve: Solver = files_for) -> dict[str, Any]:
    """The assistant message for this point of the conversation: the tool calls first, then a summary."""
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    files = solve(users[-1]) if users else None
    if files is None:
        return {"role": "assistant", "content": "I am not sure how to do that task."}
    if any(m.get("role") == "tool" for m in messages):  # the writes came back: say so and stop
        return {"role": "assistant", "content": f"Done: wrote {', '.join(files)}."}
    # Arguments written as Hermes writes them back into its history (compact, keys sorted:
    # agent/conversation_loop.py), so the next call's prompt extends this answer's text and sft trains
    # a rollout as one sequence (docs/sft.md, "Chains") instead of two.
    calls = [
        {
            "id": f"call_{secrets.token_hex(8)}",
            "type": "function",
            "function": {
                "name": "write_file",
                "arguments": json.dumps(
                    {"path": path, "content": content}, separators=(",", ":"), sort_keys=True
                ),
            },
        }
        for path, content in files.items()
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _usage(message: dict[str, Any]) -> dict[str, int]:
    # No tokenizer here: a rough count (characters / 4) so clients that read usage get numbers.
    size = len(json.dumps(message)) // 4
    return {"prompt_tokens": 0, "completion_tokens": size, "total_tokens": size}


def _chunks(message: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed deltas of ``message``: role, then the text or each tool call (its arguments in
    two pieces, as real servers split them), then the finish reason."""
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        first = {"index": index, "id": call["id"], "type": "function"}
        deltas.append(
            {"tool_calls": [{**first, "function": {"name": "write_file", "arguments": arguments[:half]}}]}
        )
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    out = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    out.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return out


async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
    try:
        body = await request.json()
        messages = body["messages"] if isinstance(body, dict) else None
    except (ValueError, KeyError):
        messages = None
    if not isinstance(messages, list):
        error = {
            "message": "expected a chat completion request with messages",
            "type": "invalid_request_error",
        }
        return JSONResponse({"error": error}, status_code=400)
    message = answer(messages, request.app.state.solve)
    head = {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "created": int(time.time()),
        "model": body.get("model", MODEL),
    }
    if not body.get("stream"):
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return JSONResponse(
            {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(message)}
        )
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[str]:
        for chunk in _chunks(message, {**head, "object": "chat.completion.chunk"}):
            yield f"data: {json.dumps(chunk)}\n\n"
        if with_usage:
            usage = {**head, "object": "chat.completion.chunk", "choices": [], "usage": _usage(message)}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def models(_: Request) -> JSONResponse:
    return JSONResponse(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "harnessrl"}]}
    )


def create_app(solve: Solver = files_for) -> Starlette:
    """The server; ``solve`` maps a task prompt to the files to write (tests pass a wrong one)."""
    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        ]
    )
    app.state.solve = solve
    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765, help="0: a free port (the URL is printed)")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))  # loopback only: the gateway is its one client
    print(f"expert: serving http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True, file=sys.stdout)
    server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
