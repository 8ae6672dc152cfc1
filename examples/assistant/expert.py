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

Served by ``examples/expert_server.py`` (shared with the search agent's expert): ``GET /v1/models``
and ``POST /v1/chat/completions``, whole or streamed, as an OpenAI-compatible server does.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the shared server
from expert_server import create_server, serve, text_of  # noqa: E402

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


Solver = Callable[[str], "dict[str, str] | None"]


def answer(messages: list[dict[str, Any]], solve: Solver = files_for) -> dict[str, Any]:
    """The assistant message for this point of the conversation: the tool calls first, then a summary."""
    users = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
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


def create_app(solve: Solver = files_for) -> Starlette:
    """The server; ``solve`` maps a task prompt to the files to write (tests pass a wrong one)."""
    return create_server(lambda messages: answer(messages, solve), MODEL)


def main() -> None:
    serve(create_app(), "expert", __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
