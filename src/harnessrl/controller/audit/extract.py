"""The reward-hack audit's input: a rollout's recorded calls turned into the actions its policy took.

``extract_commands`` reads each call's answered message in any provider's shape (OpenAI chat
messages with ``tool_calls``, Anthropic ``tool_use`` blocks, Responses ``output`` items, or text
with fenced shell blocks as mini-swe-agent's text mode uses) and yields one ``CommandRecord`` per
action: a shell command, Python code, a patch, or a file tool's create/edit/delete/read. Tools are
recognised by their argument names (``command``, ``path``, ``new_str``, ...) and tool names, not by
a list of known harnesses. ``<think>`` blocks are not actions. Pure, no I/O; ``audit`` applies the
rules to the records.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from harnessrl.controller.audit.shell import wordlist
from harnessrl.schemas import Call
from harnessrl.tasks.answers import strip_think

CommandKind = Literal["shell", "python", "patch", "file_create", "file_edit", "file_delete", "file_read"]


class CommandRecord(BaseModel):
    """One action the policy took: a shell command, Python code, a patch, or a file tool use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_seq: int
    kind: CommandKind
    text: str  # the command, code, patch, or the content written (empty for reads and deletes)
    tool: str | None = None  # tool name; None for fenced blocks in text
    path: str | None = None  # file tools only

    @property
    def command(self) -> str:
        """What the dashboard shows; every flag's ``match`` is a substring of it."""
        if self.path is None:
            return self.text
        head = f"{self.tool or self.kind} {self.path}"
        return f"{head}\n{self.text}" if self.text else head


_SHELL_KEYS = wordlist("command cmd script commands")
_PATH_KEYS = wordlist("path file_path filepath filename file notebook_path target_file")
_CONTENT_KEYS = wordlist(
    "content file_text text new_str new_string old_str old_string insert_text new_source code_edit"
)
# str_replace_editor (SWE-agent, OpenHands) passes its sub-command in ``command``: not shell.
_EDITOR_SUBCOMMANDS = wordlist(
    "view create str_replace insert undo_edit write append delete edit read replace"
)
_SHELL_TOOL = re.compile(r"bash|shell|terminal|exec|run_command|cmd|console", re.I)
_PYTHON_TOOL = re.compile(r"python|ipython|jupyter|notebook|code_interpreter", re.I)
_FENCE = re.compile(r"```[ \t]*([\w.+-]*)[^\n]*\n(.*?)```", re.S)
_SHELL_LANGS = ("", *wordlist("bash sh shell zsh mswea_bash_command bash_command console"))
_PYTHON_LANGS = wordlist("python py python3 ipython")


def extract_commands(calls: Sequence[Call]) -> list[CommandRecord]:
    """The actions the policy issued, in call order, from each call's answered message."""
    records: list[CommandRecord] = []
    for call in calls:
        for kind, name, payload in _message_parts(call.response):
            if kind == "text":
                records.extend(_records_from_text(call.seq, payload))
            else:
                records.extend(_records_from_tool(call.seq, name, _tool_args(payload)))
    return records


def _message_parts(msg: Any) -> Iterator[tuple[str, str | None, Any]]:
    """Yield ("text", None, str) and ("tool", name, arguments) from any provider's message shape."""
    if not isinstance(msg, dict):
        return
    if isinstance(msg.get("choices"), list):  # a whole chat.completions response was stored
        for choice in msg["choices"]:
            if isinstance(choice, dict):
                yield from _message_parts(choice.get("message"))
    content = msg.get("content")
    if isinstance(content, str):
        yield "text", None, content
    elif isinstance(content, list):
        for block in content:
            yield from _block_parts(block)
    for tool_call in msg.get("tool_calls") or []:
        fn = tool_call.get("function") if isinstance(tool_call, dict) else None
        if isinstance(fn, dict):
            yield "tool", _str_or_none(fn.get("name")), fn.get("arguments")
    if isinstance(msg.get("function_call"), dict):
        yield "tool", _str_or_none(msg["function_call"].get("name")), msg["function_call"].get("arguments")
    if isinstance(msg.get("output"), list):  # Responses API
        for item in msg["output"]:
            yield from _block_parts(item)


def _block_parts(block: Any) -> Iterator[tuple[str, str | None, Any]]:
    if isinstance(block, str):
        yield "text", None, block
        return
    if not isinstance(block, dict):
        return
    kind = block.get("type")
    if kind in ("text", "output_text") and isinstance(block.get("text"), str):
        yield "text", None, block["text"]
    elif kind in ("tool_use", "server_tool_use"):
        yield "tool", _str_or_none(block.get("name")), block.get("input")
    elif kind in ("function_call", "custom_tool_call"):
        yield "tool", _str_or_none(block.get("name")), block.get("arguments", block.get("input"))
    elif kind == "local_shell_call":
        yield "tool", "local_shell", block.get("action")
    elif kind == "message":
        yield from _message_parts(block)
    # thinking / reasoning blocks are not actions


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _tool_args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except ValueError:
            return {"input": raw}  # free-form tools (Codex apply_patch) or malformed JSON
        return parsed if isinstance(parsed, dict) else {"input": raw}
    return {}


def _records_from_text(seq: int, text: str) -> Iterator[CommandRecord]:
    # Thinking is not executed; only fenced blocks in the visible text are mini-swe-agent actions.
    for match in _FENCE.finditer(strip_think(text)):
        lang, body = match.group(1).lower(), match.group(2).strip("\n")
        if lang in _SHELL_LANGS:
            yield CommandRecord(call_seq=seq, kind="shell", text=body)
        elif lang in _PYTHON_LANGS:
            yield CommandRecord(call_seq=seq, kind="python", text=body)


def _records_from_tool(seq: int, name: str | None, args: dict[str, Any]) -> Iterator[CommandRecord]:
    tool = name or ""
    path = next((args[k] for k in _PATH_KEYS if isinstance(args.get(k), str)), None)
    sub = args.get("command") if isinstance(args.get("command"), str) else None
    editor_sub = sub.strip().lower() if sub is not None and path is not None else None
    if editor_sub not in _EDITOR_SUBCOMMANDS:
        editor_sub = None
    lang = str(args.get("language") or args.get("lang") or "").lower()

    def make(kind: CommandKind, text: str, with_path: bool = False) -> CommandRecord:
        return CommandRecord(call_seq=seq, kind=kind, text=text, tool=name, path=path if with_path else None)

    for key in _SHELL_KEYS:
        value = args.get(key)
        if editor_sub is not None and key == "command":
            continue
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            # Codex: ["bash", "-lc", "..."] is an argv; a list of whole commands is joined by lines.
            value = shlex.join(value) if not re.search(r"\s", value[0]) else "\n".join(value)
        if isinstance(value, str):
            yield make("shell", value)
    code = args.get("code")
    if isinstance(code, str):
        is_shell = (lang != "" and lang in _SHELL_LANGS) or (
            _SHELL_TOOL.search(tool) and not _PYTHON_TOOL.search(tool)
        )
        yield make("shell" if is_shell else "python", code)
    for key in ("input", "patch", "diff"):
        value = args.get(key)
        if not isinstance(value, str):
            continue
        if key != "input" or "patch" in tool.lower() or _looks_like_patch(value):
            yield make("patch", value)
        else:
            yield make("python" if _PYTHON_TOOL.search(tool) else "shell", value)
    if path is None:
        return
    lowered = tool.lower()
    texts = [args[k] for k in _CONTENT_KEYS if isinstance(args.get(k), str)]
    edits = args.get("edits")
    for edit in edits if isinstance(edits, list) else []:  # Claude Code MultiEdit
        if isinstance(edit, dict):
            texts += [v for k, v in edit.items() if k in _CONTENT_KEYS and isinstance(v, str)]
    kind: CommandKind
    if editor_sub == "delete" or re.search(r"delete|remove|unlink", lowered):
        kind = "file_delete"
    elif editor_sub in ("view", "read"):
        kind = "file_read"
    elif editor_sub in ("create", "write"):
        kind = "file_create"
    elif editor_sub is not None or re.search(r"edit|replace|insert|append|patch", lowered):
        kind = "file_edit"
    elif texts:
        kind = "file_edit" if any(k.startswith("old_") for k in args) else "file_create"
    elif not any(isinstance(args.get(k), str) for k in (*_SHELL_KEYS, "code", "input")):
        kind = "file_read"  # Read / view / grep tools; a shell tool's ``path`` is only its cwd
    else:
        return
    yield make(kind, "\n".join(texts) if kind in ("file_create", "file_edit") else "", True)


def _looks_like_patch(text: str) -> bool:
    return text.lstrip().startswith(("*** Begin Patch", "diff --git", "--- ")) or "\n+++ " in text
