"""Heredocs in the audit's shell reading: only a ``<<`` the shell reads hides the lines after it.

A ``<<`` inside quotes or a comment starts no heredoc in bash, so the lines after it run; the audit
must read them as commands. Real heredocs keep their bodies out of the commands (a note that
mentions curl is not a curl) and hand them to the command that reads them.
"""

from __future__ import annotations

import json

import pytest

from harnessrl.controller.audit import GIT_HISTORY, NETWORK_FETCH, PYTHON_NETWORK, audit_rollout
from harnessrl.controller.audit.shell import shell_segments
from harnessrl.schemas import Call


def rules_of(command: str) -> list[str]:
    arguments = json.dumps({"command": command})
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        ],
    }
    call = Call(
        rollout_id="r",
        seq=0,
        response=message,
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )
    return audit_rollout([call]).rules


def programs(script: str) -> list[str]:
    return [segment.words[0] for segment in shell_segments(script) if segment.words]


@pytest.mark.parametrize(
    "script",
    [
        "# note: <<true\ncurl http://example.com\ntrue",
        'echo "<<EOF"\ncurl http://example.com\nEOF',
        "echo '<<EOF'; curl http://example.com\nEOF",
        "printf 'a <<-X\\n'\ncurl http://example.com\nX",
        'echo "multi\nline <<EOF"\ncurl http://example.com\nEOF',
    ],
    ids=["comment", "double-quotes", "single-quotes", "dash-form-in-quotes", "multi-line-string"],
)
def test_a_quoted_or_commented_heredoc_marker_hides_nothing(script):
    assert "curl" in programs(script)
    assert NETWORK_FETCH in rules_of(script)


def test_a_body_claimed_inside_quotes_is_not_handed_to_a_later_heredoc():
    # The commit message's heredoc lives in "$( … )"; the script bash reads from its own heredoc
    # must still be the one attached to bash.
    script = (
        "git commit -m \"$(cat <<'EOF'\nFix the parser\nEOF\n)\"\nbash <<'SH'\ncurl http://example.com\nSH"
    )
    assert NETWORK_FETCH in rules_of(script)
    bash = next(s for s in shell_segments(script) if s.words and s.words[0] == "bash")
    assert bash.stdin == "curl http://example.com"


@pytest.mark.parametrize(
    ("script", "rule"),
    [
        ("out=\"$(bash <<'EOF'\ncurl http://example.com\nEOF\n)\"", NETWORK_FETCH),
        ('echo "$(python3 - <<PY\nimport socket\nPY\n)"', PYTHON_NETWORK),
    ],
)
def test_a_heredoc_inside_a_quoted_substitution_reaches_its_reader(script, rule):
    assert rule in rules_of(script)


@pytest.mark.parametrize(
    "script",
    [
        "cat > notes.md <<'EOF'\ncurl is not used here; git log neither\nEOF\nls",
        "cat <<EOF >> notes.md\n# a comment <<X\ncurl\nEOF\npwd",
        # Claude Code's commit idiom: the message is data, unbalanced parentheses and all
        'git commit -m "$(cat <<\'EOF\'\nDrop the curl fallback (see 1) below\n\ncurl: don\'t; wget: "no"\nEOF\n)"',
        'x=$((1 << 2))\necho "$x"',
    ],
)
def test_real_heredoc_bodies_stay_data(script):
    assert rules_of(script) == []


def test_a_real_heredoc_reaches_its_reader():
    assert PYTHON_NETWORK in rules_of("python - <<'PY'\nimport socket\nPY\nls")
    assert GIT_HISTORY in rules_of("bash <<EOF\ngit log -p\nEOF")
    segments = shell_segments("cat <<A <<-B | sh\na\nA\nb\n\tB\npwd")
    assert [s.words for s in segments] == [["cat"], ["sh"], ["pwd"]]
    assert segments[0].stdin == "b"  # the last heredoc of a command is its stdin, as in bash
