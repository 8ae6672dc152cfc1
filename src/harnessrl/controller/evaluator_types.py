"""What evaluators receive and return: ``EvaluationInput``, ``EvaluationResult``, ``EvaluatorError``.

Shared by the evaluators (``evaluators``), the command runner (``evaluator_command``) and the
controller, which imports them from ``harnessrl.controller.evaluators``. ``final_answer_text`` is
the answer the ``reasoning_gym`` and ``exact_match`` evaluators read: the last assistant text of a
rollout's calls, in any provider's message shape.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Call


class EvaluatorError(HarnessRLError):
    """The evaluator itself failed (timeout, crash, unparsable output): an infrastructure failure."""

    code = "evaluator_failed"


@dataclass(frozen=True)
class EvaluationInput:
    task: dict[str, Any]
    workspace: Path
    calls: Sequence[Call] = ()
    exit_code: int | None = None
    exit_kind: str = "exited"  # an ``ExitKind`` value
    stdout: str = ""  # the harness's stdout
    task_file: Path | None = None  # the task JSON the harness saw; written to a temp file if None
    rollout_id: str = ""

    @property
    def final_answer(self) -> str:
        """The content of the last assistant message with text, ``<think>`` blocks removed."""
        return final_answer_text(self.calls)


@dataclass(frozen=True)
class EvaluationResult:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)


THINK = re.compile(r"<think>.*?</think>", re.S)  # reasoning blocks, never part of the answer


def final_answer_text(calls: Sequence[Call]) -> str:
    """The last non-empty assistant text in ``calls`` (OpenAI, Anthropic or Responses shapes)."""
    for call in sorted(calls, key=lambda c: c.seq, reverse=True):
        text = THINK.sub("", _message_text(call.response)).strip()
        if text:
            return text
    return ""


def _message_text(msg: Any) -> str:
    if not isinstance(msg, dict):
        return ""
    if isinstance(msg.get("choices"), list) and msg["choices"]:
        return _message_text((msg["choices"][-1] or {}).get("message"))
    content = msg.get("content")
    if isinstance(content, str):
        return content
    parts = (
        content
        if isinstance(content, list)
        else msg.get("output")
        if isinstance(msg.get("output"), list)
        else []
    )
    texts = []
    for part in parts:
        if isinstance(part, dict) and part.get("type") in ("text", "output_text"):
            texts.append(str(part.get("text", "")))
        elif isinstance(part, dict) and part.get("type") == "message":
            texts.append(_message_text(part))
    return "\n".join(t for t in texts if t)
