"""Pulling a final answer out of a model's reply, and comparing it with a gold answer.

Shared by the ``reasoning_gym`` and ``exact_match`` evaluators and by task modules that check what
the policy said (``harnessrl.tasks.scienceworld``): ``final_answer_text`` is the last assistant
text of a rollout's calls, in any provider's message shape; ``extract_answer`` pulls the answer out
of it. The default convention is the one ``harnessrl.tasks.reasoning_gym`` prompts for: a last
line ``Answer: X``. Depends only on ``harnessrl.schemas``: tasks never import the controller.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, Literal

from harnessrl.schemas import Call

AnswerFallback = Literal["none", "last_line", "last_number"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"^\\boxed\{(.*)\}$")


def extract_answer(
    text: str, pattern: re.Pattern[str] | None, fallback: AnswerFallback = "none"
) -> str | None:
    """The answer in ``text``: group 1 (or the whole match) of the *last* match of ``pattern``;
    without a match, per ``fallback``, the last non-empty line, the last number, or None. Without a
    pattern the whole text. Surrounding markdown (``**``, backticks, ``$``), ``\\boxed{}`` and one
    trailing period are removed: formatting is not what the reward measures."""
    answer: str | None = None
    if pattern is None:
        answer = text
    else:
        matches = list(pattern.finditer(text))
        if matches:
            last = matches[-1]
            answer = last.group(1) if pattern.groups else last.group(0)
        elif fallback == "last_line":
            answer = next((line for line in reversed(text.splitlines()) if line.strip()), None)
        elif fallback == "last_number":
            numbers = _NUMBER.findall(text.replace(",", ""))
            answer = numbers[-1] if numbers else None
    if answer is None:
        return None
    for _ in range(2):  # "**7.**", "`7`.", "$\\boxed{7}$."
        answer = answer.strip().strip("*`$ \t").strip()
        boxed = _BOXED.match(answer)
        if boxed:
            answer = boxed.group(1).strip()
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1].rstrip()
    return answer


def normalize_answer(text: str) -> str:
    """Case-folded, whitespace collapsed, trailing period dropped."""
    return " ".join(text.casefold().split()).rstrip(".").rstrip()


#: A number as an answer writes it: ASCII digits, commas only as thousands separators, an optional
#: fraction and exponent. Anything else (``1,2,3``, ``1_000``, other scripts' digits) is compared as text.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,4})?")


def as_number(text: str) -> Decimal | None:
    """``text`` as an exact decimal number, or None if it is not written as a plain number."""
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    return Decimal(text.replace(",", ""))


def answers_match(answer: str, gold: str, *, normalize: bool = True) -> bool:
    """Equal, or with ``normalize`` equal after ``normalize_answer`` or as numbers: exactly equal
    values (``7.0`` and ``7``, ``1,000`` and ``1000``, ``1e3`` and ``1000``), never nearly equal ones
    (floats kept the first ~16 digits of ``12345678901234567890``: an answer off in the last digits
    matched, so long arithmetic paid for an approximate answer)."""
    if not normalize:
        return answer == gold
    a, g = normalize_answer(answer), normalize_answer(gold)
    if a == g:
        return True
    x, y = as_number(a), as_number(g)
    return x is not None and y is not None and x == y


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"  # reasoning blocks, never part of the answer


def strip_think(text: str) -> str:
    """``text`` without its ``<think>...</think>`` blocks (reasoning, never part of the answer); an
    unclosed ``<think>`` stays. One pass over the text: the regex ``<think>.*?</think>`` took time
    quadratic in the number of unclosed ``<think>`` (128 KiB of them: 10 s of the controller's loop)."""
    kept: list[str] = []
    position = 0
    while (start := text.find(_THINK_OPEN, position)) >= 0:
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end < 0:
            break
        kept.append(text[position:start])
        position = end + len(_THINK_CLOSE)
    kept.append(text[position:])
    return "".join(kept)


def final_answer_text(calls: Sequence[Call]) -> str:
    """The last non-empty assistant text in ``calls`` (OpenAI, Anthropic or Responses shapes),
    ``<think>`` blocks removed."""
    for call in sorted(calls, key=lambda c: c.seq, reverse=True):
        text = strip_think(_message_text(call.response)).strip()
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
