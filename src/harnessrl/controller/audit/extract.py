"""The reward-hack audit's input: a rollout's recorded calls turned into the actions its policy took.

``extract_commands`` reads each call's answered message in any provider's shape (OpenAI chat
messages with ``tool_calls``, Anthropic ``tool_use`` blocks, Responses ``output`` items, or text
with fenced shell blocks as mini-swe-agent's text mode uses) and yields one ``CommandRecord`` per
action: a shell command, Python code, a patch, or a file tool's create/edit/delete/read. Tools are
recognised by their argument names (``command``, ``path``, ``new_str``, ``filePath``, ...) and tool
names, not by a list of known harnesses. Pure, no I/O; ``audit`` applies the rules to the records.

Text is read the way a harness reads it, and wider: mini-swe-agent runs what its ``action_regex``
finds anywhere in ``message.content``, ``<think>`` blocks included (it strips none, and a reasoning
parser leaves a second ``<think>`` in the content), so every block any shipped regex takes is a
record, and so is every fenced block a Markdown reader or an unanchored regex would pair. Reading a
block that did not run can only over-flag; missing one that did is a hiding place.
"""

from __future__ import annotations

import bisect
import json
import re
import shlex
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from harnessrl.controller.audit.shell import wordlist
from harnessrl.schemas import Call

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
# OpenCode spells its file tools' arguments in camelCase (read/write/edit: ``filePath``, ``oldString``,
# ``newString``); OpenClaw's edit passes ``edits: [{"oldText", "newText"}]``.
_PATH_KEYS = wordlist("path file_path filepath filePath filename file notebook_path target_file")
_OLD_TEXT_KEYS = wordlist("old_str old_string oldString oldText")
_CONTENT_KEYS = wordlist(
    "content file_text text new_str new_string newString newText old_str old_string oldString oldText"
    " insert_text new_source code_edit"
)
_PATCH_KEYS = wordlist("patch diff patchText")  # patchText: OpenCode's apply_patch
# Text typed into a running process (a shell the policy started): Codex ``write_stdin`` (``chars``),
# Hermes's and OpenClaw's ``process`` tool (``action: write``/``submit``/``paste`` with ``data``/``text``).
_STDIN_TOOL = re.compile(r"stdin|^process$", re.I)
_STDIN_KEYS = wordlist("chars data text literal")
# str_replace_editor (SWE-agent, OpenHands) passes its sub-command in ``command``: not shell.
_EDITOR_SUBCOMMANDS = wordlist(
    "view create str_replace insert undo_edit write append delete edit read replace"
)
_SHELL_TOOL = re.compile(r"bash|shell|terminal|exec|run_command|cmd|console", re.I)
# Hermes's ``execute_code`` runs Python (its name alone would read as shell: "exec").
_PYTHON_TOOL = re.compile(r"python|ipython|jupyter|notebook|code_interpreter|execute_code", re.I)
_SHELL_LANGS = ("", *wordlist("bash sh shell zsh mswea_bash_command bash_command console"))
_PYTHON_LANGS = wordlist("python py python3 ipython")
_FENCE_LANG = re.compile(r"[ \t]*([\w.+-]*)")  # after an opening ```
# A labelled opening wherever it stands, even where pairing fences in order took its ``` as the end of
# an earlier block: mini-swe-agent's default regex finds ```mswea_bash_command right after a ```text block.
_LABELLED_OPENING = re.compile(
    r"```[ \t]*("
    + "|".join(
        sorted((re.escape(lang) for lang in _SHELL_LANGS + _PYTHON_LANGS if lang), key=len, reverse=True)
    )
    + r")[ \t]*\n",
    re.I,
)
# The action regexes of the text-mode harnesses we ship, exactly as they are configured; mini-swe-agent
# runs ``re.findall(regex, content, re.DOTALL)`` on the whole content. Each pair: (regex, the text every
# match ends with, so the search can stop at its last occurrence and stay linear in the text).
HARNESS_ACTION_REGEXES: tuple[tuple[str, str], ...] = (
    (r"```mswea_bash_command\s*\n(.*?)\n```", "\n```"),  # mini-swe-agent's default (litellm_textbased)
    (r"\A.*?```(?:bash|sh|shell)?[ \t]*\n(.*?)\n```", "\n```"),  # examples/shell_agent, search_agent
    (r"<mswea_bash_command>(.*?)</mswea_bash_command>", "</mswea_bash_command>"),  # its swebench_xml.yaml
)


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
        except (ValueError, RecursionError):
            # Free-form tools (Codex apply_patch) or malformed JSON; or JSON nested past the parser's
            # depth (``[[[...]]]`` 3,000 deep, a few hundred tokens of the policy's): its
            # ``RecursionError`` crashed the audit, and the controller recorded the policy's rollout
            # as an infrastructure failure ("controller error"), out of its group's baseline.
            return {"input": raw}
        return parsed if isinstance(parsed, dict) else {"input": raw}
    return {}


def _records_from_text(seq: int, text: str) -> Iterator[CommandRecord]:
    # Nothing is stripped first, <think> blocks included: mini-swe-agent runs the actions in them.
    seen: set[tuple[CommandKind, str]] = set()
    for _, kind, body in sorted(_text_actions(text), key=lambda action: action[0]):
        if (kind, body) not in seen:
            seen.add((kind, body))
            yield CommandRecord(call_seq=seq, kind=kind, text=body)


def _text_actions(text: str) -> Iterator[tuple[int, CommandKind, str]]:
    """(offset, kind, body) of every block a text-mode harness could run, duplicates included."""
    for pattern, closing in HARNESS_ACTION_REGEXES:
        end = text.rfind(closing)
        if end >= 0:  # no match can end past the last closing; the regex never scans beyond it
            for match in re.finditer(pattern, text[: end + len(closing)], re.DOTALL):
                yield match.start(1), "shell", match.group(1).strip()
    yield from _paired_fences(text)
    closings = [match.start() for match in re.finditer("\n```", text)]
    for match in _LABELLED_OPENING.finditer(text):
        at = bisect.bisect_left(closings, match.end())
        kind = _fence_kind(match.group(1))
        if at < len(closings) and kind is not None:
            yield match.end(), kind, text[match.end() : closings[at]].strip()


def _paired_fences(text: str) -> Iterator[tuple[int, CommandKind, str]]:
    """Fenced blocks paired in order, as a Markdown reader or an unanchored ``findall`` pairs them.

    What the lazy regex (an opening ```, its language, the rest of its line, the body up to the next
    ```) finds, written out: the regex retries every later ``` after one that cannot close and scans
    to the end of the line each time, quadratic in a long line of backticks.
    """
    position = 0
    while (opening := text.find("```", position)) >= 0:
        line_end = text.find("\n", opening + 3)
        closing = text.find("```", line_end + 1) if line_end >= 0 else -1
        if closing < 0:
            return  # every later opening has a later line end: it cannot close either
        language = _FENCE_LANG.match(text, opening + 3)
        kind = _fence_kind(language.group(1) if language else "")
        if kind is not None:
            yield line_end + 1, kind, text[line_end + 1 : closing].strip()
        position = closing + 3


def _fence_kind(lang: str) -> CommandKind | None:
    lang = lang.lower()
    return "shell" if lang in _SHELL_LANGS else "python" if lang in _PYTHON_LANGS else None


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
    if _STDIN_TOOL.search(tool):
        for key in _STDIN_KEYS:
            if isinstance(args.get(key), str) and args[key].strip():
                yield make("shell", args[key])
    for key in ("input", *_PATCH_KEYS):
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
    for edit in edits if isinstance(edits, list) else []:  # Claude Code MultiEdit, OpenClaw edit
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
        kind = (
            "file_edit" if any(k in _OLD_TEXT_KEYS or k.startswith("old_") for k in args) else "file_create"
        )
    elif not any(isinstance(args.get(k), str) for k in (*_SHELL_KEYS, "code", "input")):
        kind = "file_read"  # Read / view / grep tools; a shell tool's ``path`` is only its cwd
    else:
        return
    yield make(kind, "\n".join(texts) if kind in ("file_create", "file_edit") else "", True)


def _looks_like_patch(text: str) -> bool:
    return text.lstrip().startswith(("*** Begin Patch", "diff --git", "--- ")) or "\n+++ " in text
