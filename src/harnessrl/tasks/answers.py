"""Pulling a final answer out of a model's reply, and comparing it with a gold answer.

Shared by the ``reasoning_gym`` and ``exact_match`` evaluators and by task modules that check what
the policy said (``harnessrl.tasks.scienceworld``): ``final_answer_text`` is the last assistant
text of a rollout's main conversation (``side_calls``: a harness's title or summary call after the
answer is not the answer), in any provider's message shape; ``sampled_text`` is all the text one
reply holds, tool-call arguments included; ``extract_answer`` pulls the answer out of it. Every
function here is linear in the policy's text: no backtracking regex runs on it. The default convention is the one ``harnessrl.tasks.reasoning_gym`` prompts for: a last
line ``Answer: X``. Depends only on ``harnessrl.schemas``: tasks never import the controller.
"""

from __future__ import annotations

import json
import re
import unicodedata
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from harnessrl.schemas import Call

AnswerFallback = Literal["none", "last_line", "last_number"]

# A run of digits and commas, then a fraction or a denominator: one pass, nothing to backtrack into.
# Its commas are thousands separators only in the 1,234,567 shape (``_last_number``).
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d[\d,]*)?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+")
_BOXED_OPEN = "\\boxed{"
_MINUS_SIGN = "\u2212"  # U+2212, what LaTeX and typeset math write for "-"


def _strip_edges(text: str) -> str:
    """``text`` without whitespace or invisible format characters (Unicode category Cf: a
    right-to-left mark, a zero-width space, a BOM) at either end. One pass from each end."""
    start, end = 0, len(text)
    while start < end and (text[start].isspace() or unicodedata.category(text[start]) == "Cf"):
        start += 1
    while end > start and (text[end - 1].isspace() or unicodedata.category(text[end - 1]) == "Cf"):
        end -= 1
    return text[start:end]


def _unbox(text: str) -> str | None:
    """The inside of ``\\boxed{...}`` when that box is the whole of ``text``, else None. Braces are
    counted, so ``\\boxed{1} or \\boxed{2}`` is not one box (a greedy ``\\boxed\\{(.*)\\}``
    read it as the answer ``1} or \\boxed{2``)."""
    if not text.startswith(_BOXED_OPEN) or not text.endswith("}"):
        return None
    depth = 1
    for index in range(len(_BOXED_OPEN), len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[len(_BOXED_OPEN) : index] if index == len(text) - 1 else None
    return None


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
        last = deque(pattern.finditer(text), maxlen=1)  # only the last kept: a list held every match
        if last:
            answer = last[0].group(1) if pattern.groups else last[0].group(0)
        elif fallback == "last_line":
            answer = next((line for line in reversed(text.splitlines()) if line.strip()), None)
        elif fallback == "last_number":
            numbers = _NUMBER.findall(text.replace(_MINUS_SIGN, "-"))
            answer = _last_number(numbers[-1]) if numbers else None
    if answer is None:
        return None
    for _ in range(2):  # "**7.**", "`7`.", "$\\boxed{7}$."
        answer = _strip_edges(_strip_edges(answer).strip("*`$ \t"))
        boxed = _unbox(answer)
        if boxed is not None:
            answer = _strip_edges(boxed)
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1].rstrip()
    return answer


def _last_number(found: str) -> str:
    """The last number in one ``_NUMBER`` match: ``12,345.5`` is 12345.5 and ``2,000/3,000`` a
    fraction, but ``1,2,3`` is a list whose last number is 3 (every comma was dropped before, which
    read it as 123)."""
    numerator, slash, denominator = found.partition("/")
    whole, point, fraction = numerator.partition(".")
    whole = whole.rstrip(",")
    if "," in whole and not _THOUSANDS.fullmatch(whole):
        whole = whole.rsplit(",", 1)[1]  # a list: its last item
    if not slash:
        return whole.replace(",", "") + point + fraction
    denominator = denominator.rstrip(",")
    if "," in denominator and not _THOUSANDS.fullmatch(denominator):
        return denominator.rsplit(",", 1)[1]  # "1/2,3": a list whose last item is 3
    return f"{whole.replace(',', '')}{point}{fraction}/{denominator.replace(',', '')}"


def normalize_answer(text: str) -> str:
    """Case-folded, whitespace collapsed, invisible format characters at the ends dropped, U+2212
    (the typeset minus) read as ``-``, trailing period dropped."""
    text = _strip_edges(text.replace(_MINUS_SIGN, "-"))
    return " ".join(text.casefold().split()).rstrip(".").rstrip()


#: A number as an answer writes it: ASCII digits, commas only as thousands separators, an optional
#: fraction (``.5`` as well as ``0.5``) and exponent. Anything else (``1,2,3``, ``1_000``, other
#: scripts' digits) is compared as text.
_PLAIN_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?"
)


def as_number(text: str) -> Decimal | None:
    """``text`` as an exact decimal number, or None if it is not written as a plain number.

    A leading zero before another digit (``0110``, ``007``) is not a plain number: such answers are
    codes, zip codes, binary strings, clock times, compared as text (``110`` is not ``0110``).
    ``0.5`` and ``0`` are numbers."""
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    digits = text.lstrip("+-")
    if len(digits) > 1 and digits[0] == "0" and digits[1] in "0123456789,":
        return None
    return Decimal(text.replace(",", ""))


def blank_answer(text: str) -> bool:
    """Whether ``text`` is no answer at all once normalized (empty, whitespace, invisible format
    characters, periods)."""
    return normalize_answer(text) == ""


def answers_match(answer: str, gold: str, *, normalize: bool = True) -> bool:
    """Equal, or with ``normalize`` equal after ``normalize_answer`` or as numbers: exactly equal
    values (``7.0`` and ``7``, ``1,000`` and ``1000``, ``1e3`` and ``1000``), never nearly equal ones
    (floats kept the first ~16 digits of ``12345678901234567890``: an answer off in the last digits
    matched, so long arithmetic paid for an approximate answer).

    A blank gold (``blank_answer``: ``""``, ``" "``, ``"."``) matches nothing: it matched every reply
    that says nothing (``""``, ``"."``, ``"**"``), so a task with a blank gold, or a blank among its
    alternatives, paid 1 for an empty reply."""
    if blank_answer(gold):
        return False
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
    """The last non-empty assistant text of the rollout's main conversation (OpenAI, Anthropic or
    Responses shapes), ``<think>`` blocks removed: ``calls`` in ``seq`` order, side calls left out
    (``side_calls``). Reading any call's text scored a harness's small call made after the agent's
    answer (a title, a summary) instead of the answer, and let the policy plant an answer there."""
    side = side_calls(calls)
    for call in sorted(calls, key=lambda c: c.seq, reverse=True):
        if call.seq in side:
            continue
        text = strip_think(_message_text(call.response)).strip()
        if text:
            return text
    return ""


def side_calls(calls: Sequence[Call]) -> set[int]:
    """The ``seq`` of each *side call* in ``calls``: a call alone in its conversation whose prompt is
    shorter than the main conversation's first prompt.

    A conversation is a chain of calls as the trainer builds its samples (``trajectory.samples``):
    each call's prompt extends an earlier call's prompt + response, token for token (the longest
    such chain; ties: the newest). The main one is the chain with the most calls (ties: the longest
    first prompt, then the newest). Its first prompt holds the harness's system prompt, its tools and
    the task, so a call on a chain of its own with a shorter prompt is not the agent at work: a
    title or summary call (a small, different system prompt), the harness's quota probe, or a call
    the policy's code made on the side. A call alone but as long (the agent after its history was
    compacted, a retried request) is kept, and so is every call of a chain of two or more
    (subagents: their text comes before the main agent's last reply)."""
    chains = _conversations(sorted(calls, key=lambda c: c.seq))
    if not chains:
        return set()
    main = max(chains, key=lambda chain: (len(chain.seqs), chain.first_prompt, chain.seqs[-1]))
    return {
        chain.seqs[0] for chain in chains if len(chain.seqs) == 1 and chain.first_prompt < main.first_prompt
    }


#: Chains a call is matched against: the most recently extended. An agent, its subagents and a
#: few side calls need a handful; bounded, a rollout of many thousands of calls (a policy looping on
#: side calls) costs time linear in its calls, not quadratic, and memory for this many chains.
_LIVE_CHAINS = 64


@dataclass(slots=True)
class _Conversation:
    tokens: bytes  # the newest call's prompt + response token IDs, packed
    first_prompt: int  # tokens in the first call's prompt
    seqs: list[int]


def _packed(token_ids: Sequence[int]) -> bytes:
    # Packed, a prefix test is one memcmp (token IDs are vocabulary indices: 64 bits hold them).
    return array("q", token_ids).tobytes()


def _conversations(calls: Sequence[Call]) -> list[_Conversation]:
    """``calls`` (in ``seq`` order) grouped into chains: each joins the longest of the
    ``_LIVE_CHAINS`` most recently extended chains that its prompt extends (ties: the chain extended
    last), else starts one."""
    chains: list[_Conversation] = []
    live: list[_Conversation] = []  # the most recently extended last
    for call in calls:
        prompt = _packed(call.prompt_token_ids)
        extended = [c for c in live if prompt.startswith(c.tokens)]
        if extended:  # max keeps the first of equals: reversed, that is the newest-extended
            chain = max(reversed(extended), key=lambda c: len(c.tokens))
            live.remove(chain)
            chain.seqs.append(call.seq)
        else:
            chain = _Conversation(b"", len(call.prompt_token_ids), [call.seq])
            chains.append(chain)
        chain.tokens = prompt + _packed(call.response_token_ids)
        live.append(chain)
        if len(live) > _LIVE_CHAINS:
            live.pop(0).tokens = b""  # matched no more: its tokens need not be kept
    return chains


def sampled_text(response: Any) -> str:
    """All the text the model produced in one recorded reply: its assistant text (``<think>``
    blocks removed) and the arguments of its tool calls (OpenAI ``tool_calls[].function.arguments``,
    Anthropic ``tool_use.input``, Responses ``function_call.arguments``), for checking that
    something a harness reports was the policy's choice. Never the request: only the reply. Each
    argument value is its own segment (joined by a NUL line, which a match cannot span), so
    ``{"a": "open", "b": "door"}`` does not hold "open door"."""
    segments = [strip_think(_message_text(response))]
    for arguments in _tool_arguments(response):
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                segments.append(arguments)  # not JSON: the text as the model wrote it
                continue
        segments.extend(_scalars(arguments))
    return "\n\0\n".join(s for s in segments if s)


def _tool_arguments(msg: Any) -> list[Any]:
    """The raw arguments of each tool call in a reply, in any provider's shape."""
    if not isinstance(msg, dict):
        return []
    if isinstance(msg.get("choices"), list) and msg["choices"]:
        message = (msg["choices"][-1] or {}).get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        return [
            c["function"].get("arguments")
            for c in calls or []
            if isinstance(c, dict) and isinstance(c.get("function"), dict)
        ]
    parts = msg.get("content") if isinstance(msg.get("content"), list) else msg.get("output")
    out = []
    for part in parts if isinstance(parts, list) else []:
        if isinstance(part, dict) and part.get("type") == "tool_use":
            out.append(part.get("input"))
        elif isinstance(part, dict) and part.get("type") == "function_call":
            out.append(part.get("arguments"))
    return out


def _scalars(value: Any) -> list[str]:
    """Every string and number inside a JSON value, in order (iterative: any depth)."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            out.append(str(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


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
