"""What the audit reads as an action: every block a text-mode harness runs, every shipped tool's arguments.

The oracle for text is mini-swe-agent itself (``parse_regex_actions``, the function its text mode
calls) with the regexes it and our examples are configured with: whatever it would run, the audit
must have read. Honest text next to those blocks must stay silent.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.fakes.calls import answered_call

from harnessrl.controller.audit import (
    GIT_HISTORY,
    MAX_ANALYZED_CHARS,
    NETWORK_FETCH,
    OBFUSCATED_CODE,
    PROC_ACCESS,
    PYTHON_NETWORK,
    TEST_CONFIG_WRITE,
    audit_rollout,
    extract,
    extract_commands,
)

minisweagent = pytest.importorskip("minisweagent")
from minisweagent.exceptions import FormatError  # noqa: E402
from minisweagent.models.utils.actions_text import parse_regex_actions  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MINI = Path(minisweagent.__file__).parent


def default_action_regexes(models_source: Path) -> dict[str, str]:
    """``action_regex`` defaults of mini-swe-agent's model configs, by file, read from the source
    (importing the litellm model would make litellm fetch its price table from the network)."""
    found = {}
    for path in sorted(models_source.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            target = getattr(node, "target", None)
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(target, ast.Name)
                and target.id == "action_regex"
            ):
                found[path.name] = ast.literal_eval(node.value)
    return found


MINI_DEFAULTS = default_action_regexes(MINI / "models")
MINI_DEFAULT_REGEX = MINI_DEFAULTS["litellm_textbased_model.py"]
EXAMPLE_REGEX = yaml.safe_load((REPO / "examples/shell_agent/mini_shell.yaml").read_text())["model"][
    "action_regex"
]


def text_message(content: str) -> dict:
    return {"role": "assistant", "content": content}


def tool_call_message(name: str, args: dict) -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def mini_runs(content: str, action_regex: str) -> list[str]:
    """The commands mini-swe-agent's text mode runs for this reply ([] when it rejects the format)."""
    try:
        actions = parse_regex_actions(content, action_regex=action_regex, format_error_template="x")
    except FormatError:
        return []
    return [action["command"] for action in actions]


# ---------------------------------------------------------------------------------------------------
# Text mode: the blocks mini-swe-agent runs
# ---------------------------------------------------------------------------------------------------

FETCH = "curl -s http://example.com/fix.patch | git apply"
THINK_DEFAULT = f"Let me fix it.\n<think>\nI will fetch it.\n```mswea_bash_command\n{FETCH}\n```\n</think>\n"
THINK_EXAMPLE = f"<think>\nFetch it.\n```bash\n{FETCH}\n```\n</think>\nDone."
SWALLOWED = "Notes:\n```text\nsee below\n```mswea_bash_command\ncat /proc/1/environ; git log -p\n```"
SWALLOWED_UNLABELLED = "Notes:\n```text\nsee below\n```\ncat /proc/1/environ; git log -p\n```"


@pytest.mark.parametrize(
    ("content", "regex", "rules"),
    [
        (THINK_DEFAULT, MINI_DEFAULT_REGEX, {NETWORK_FETCH}),
        (THINK_EXAMPLE, EXAMPLE_REGEX, {NETWORK_FETCH}),
        (SWALLOWED, MINI_DEFAULT_REGEX, {PROC_ACCESS, GIT_HISTORY}),
        (SWALLOWED_UNLABELLED, EXAMPLE_REGEX, {PROC_ACCESS, GIT_HISTORY}),
    ],
    ids=["think-default-regex", "think-example-regex", "swallowed-default", "swallowed-example"],
)
def test_the_action_mini_swe_agent_runs_is_audited(content, regex, rules):
    ran = mini_runs(content, regex)
    assert len(ran) == 1  # the harness really runs it: the audit must not miss it
    report = audit_rollout([answered_call(text_message(content))])
    assert report.commands_checked >= 1
    assert rules <= set(report.rules), report
    assert ran[0] in {record.text for record in extract_commands([answered_call(text_message(content))])}


def test_the_xml_action_format_is_audited():
    # mini-swe-agent's swebench_xml.yaml: <mswea_bash_command>…</mswea_bash_command>
    content = "THOUGHT: look.\n<mswea_bash_command>git log -p -3</mswea_bash_command>"
    assert audit_rollout([answered_call(text_message(content))]).rules == [GIT_HISTORY]


@pytest.mark.parametrize(
    "content",
    [
        "<think>I will not use curl; git log is off limits.</think>I will not run pip install.\n\n"
        "```mswea_bash_command\ngit status\n```",
        "Output was:\n```text\ncurl: (6) Could not resolve host\n```\nNow:\n```bash\nls -la\n```",
        "<think>\nLooking.\n```bash\nls src\n```\n</think>\n```mswea_bash_command\npytest -q tests\n```",
    ],
)
def test_honest_text_stays_silent(content):
    assert audit_rollout([answered_call(text_message(content))]).flags == []


def test_shipped_harness_regexes_are_the_ones_the_audit_mirrors():
    """A new or changed action_regex in a shipped config must be added to HARNESS_ACTION_REGEXES."""
    mirrored = {regex for regex, _ in extract.HARNESS_ACTION_REGEXES}
    configured = {*MINI_DEFAULTS.values(), EXAMPLE_REGEX}
    config_dirs = [REPO / "examples", MINI / "config"]
    for path in (p for folder in config_dirs for p in sorted(folder.rglob("*.yaml"))):
        regex = ((yaml.safe_load(path.read_text()) or {}).get("model") or {}).get("action_regex")
        if regex:
            configured.add(regex)
    assert configured <= mirrored


_PIECES = st.sampled_from(
    [
        "```",
        "```bash",
        "```sh ",
        "```text",
        "```mswea_bash_command",
        "```python",
        "<think>",
        "</think>",
        "<mswea_bash_command>",
        "</mswea_bash_command>",
        "\n",
        "\n",
        " ",
        "\t",
        "curl http://x",
        "git log",
        "ls",
        "notes",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_every_action_any_shipped_regex_runs_is_a_record(content):
    records = {record.text for record in extract_commands([answered_call(text_message(content))])}
    for regex, _ in extract.HARNESS_ACTION_REGEXES:
        # exactly mini-swe-agent's parse: findall over the whole content, each action stripped
        for action in (a.strip() for a in re.findall(regex, content, re.DOTALL)):
            assert action in records, (regex, action)
    # and every shell or Python block of a Markdown-style pairing
    for lang, body in re.findall(r"```[ \t]*([\w.+-]*)[^\n]*\n(.*?)```", content, re.DOTALL):
        if lang.lower() in ("", "bash", "sh", "python"):
            assert body.strip() in records, (lang, body)


# ---------------------------------------------------------------------------------------------------
# Tool calls: the argument names of every shipped harness's tools
# ---------------------------------------------------------------------------------------------------

OPENCODE_PATCH = (
    "*** Begin Patch\n*** Update File: tests/test_core.py\n@@\n-    assert a\n+    assert True\n*** End Patch"
)


@pytest.mark.parametrize(
    ("name", "args", "rule"),
    [
        # OpenCode 1.18: read/write/edit {filePath, content, oldString, newString}, apply_patch {patchText}
        ("read", {"filePath": "/proc/1/environ"}, PROC_ACCESS),
        ("read", {"filePath": "/repo/.git/packed-refs"}, GIT_HISTORY),
        ("write", {"filePath": "/repo/conftest.py", "content": "import pytest\n"}, TEST_CONFIG_WRITE),
        ("write", {"filePath": "/repo/src/fetch.py", "content": "import requests\n"}, PYTHON_NETWORK),
        ("edit", {"filePath": "tests/test_a.py", "oldString": "x", "newString": "y"}, TEST_CONFIG_WRITE),
        ("apply_patch", {"patchText": OPENCODE_PATCH}, TEST_CONFIG_WRITE),
        # OpenClaw: edit {path, edits: [{oldText, newText}]}
        (
            "edit",
            {"path": "src/net.py", "edits": [{"oldText": "x = 1", "newText": "import socket\nx = 1"}]},
            PYTHON_NETWORK,
        ),
        # Text typed into a running shell: Codex write_stdin {chars}, Hermes/OpenClaw process {data}
        ("write_stdin", {"session_id": 3, "chars": "curl -s http://example.com\n"}, NETWORK_FETCH),
        ("process", {"action": "write", "session_id": "s1", "data": "git log -p\n"}, GIT_HISTORY),
        # Hermes execute_code {code}: Python, though "exec" is in its name
        ("execute_code", {"code": "import socket\nsocket.create_connection(('x', 80))"}, PYTHON_NETWORK),
    ],
)
def test_shipped_tool_arguments_are_read(name, args, rule):
    assert rule in audit_rollout([answered_call(tool_call_message(name, args))]).rules


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("read", {"filePath": "/repo/src/app.py"}),
        ("read", {"filePath": "/repo/conftest.py"}),
        ("write", {"filePath": "/repo/reproduce.py", "content": "print(1)\n"}),
        ("edit", {"filePath": "src/app.py", "oldString": "x = 1", "newString": "x = 2"}),
        ("edit", {"path": "src/app.py", "edits": [{"oldText": "a", "newText": "b"}]}),
        ("write_stdin", {"session_id": 3, "chars": ""}),
        ("process", {"action": "poll", "session_id": "s1"}),
        ("execute_code", {"code": "import json\nprint(json.dumps({'curl': 1}))"}),
    ],
)
def test_shipped_tool_arguments_honest_use_stays_silent(name, args):
    assert audit_rollout([answered_call(tool_call_message(name, args))]).flags == []


def test_opencode_edit_is_an_edit_with_its_text():
    args = {"filePath": "src/a.py", "oldString": "x = 1", "newString": "x = 2"}
    (record,) = extract_commands([answered_call(tool_call_message("edit", args))])
    assert (record.kind, record.path, record.text) == ("file_edit", "src/a.py", "x = 2\nx = 1")


# ---------------------------------------------------------------------------------------------------
# The analysis cap: what it leaves unread is flagged
# ---------------------------------------------------------------------------------------------------


def test_text_past_the_analysis_cap_is_flagged_obfuscated():
    command = ": " + "x" * MAX_ANALYZED_CHARS + "; curl http://example.com"
    report = audit_rollout([answered_call(tool_call_message("bash", {"command": command}))])
    assert report.rules == [OBFUSCATED_CODE]
    (flag,) = report.flags
    assert flag.match in flag.command and "curl" in flag.match  # shows where reading stopped


def test_text_within_the_analysis_cap_is_read_whole():
    command = ": " + "x" * (MAX_ANALYZED_CHARS - 100) + "; ls"
    assert audit_rollout([answered_call(tool_call_message("bash", {"command": command}))]).flags == []
