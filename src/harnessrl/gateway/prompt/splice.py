"""The splices behind ``conversation.build_prompt``: an earlier call's exact prompt and sampled
answer, then only the text the chat template renders after that answer's turn, encoded.

Each returns the spliced prompt's token IDs, or ``None`` where the renders do not line up and the
caller must encode the whole conversation. ``splice`` is the plain case (the render of the shared
history is a prefix of the full render), ``splice_incremental`` the same from a short surrogate
conversation, ``splice_after_turn`` the case of a template that rewrites earlier turns (Qwen3 drops
the reasoning of earlier turns). The algorithm and its limits are in ``conversation``'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harnessrl.gateway.prompt.messages import PriorCall
from harnessrl.token_ids import TokenIds

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer


def splice_incremental(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    prior: PriorCall,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> list[int] | None:
    """The spliced prompt rendered from a surrogate conversation, or ``None`` to use the full path."""
    n = len(prior.message_keys)
    tail = list(messages[n + 1 :])
    if any(m["role"] in ("assistant", "system") for m in tail):
        # An assistant turn in the tail may render by global rules (e.g. dropped <think>); a system
        # message may be moved into the header at the top (DeepSeek's template gathers them there).
        return None
    head = [messages[0]] if messages[0]["role"] == "system" and n > 0 else []
    before = [messages[n - 1]] if n - 1 >= len(head) else []
    surrogate = [*head, *before, messages[n]]
    try:
        prefix_text = tokenizer.render_chat(surrogate, tools=tools, add_generation_prompt=False, **kwargs)
        full_text = tokenizer.render_chat(surrogate + tail, tools=tools, add_generation_prompt=True, **kwargs)
    except Exception:  # a template may refuse the surrogate (e.g. role-alternation checks)
        return None
    return splice(tokenizer, prior, prefix_text, full_text)


def splice(
    tokenizer: PolicyTokenizer, prior: PriorCall, prefix_text: str, full_text: str
) -> list[int] | None:
    if not full_text.startswith(prefix_text):
        return None  # the template renders the shared history differently with more turns after it
    stop_ids = list(tokenizer.stop_token_ids)
    # The end-of-turn token closing the assistant turn is the last stop-token string in the prefix.
    best_pos, eot_id, eot_text = -1, None, ""
    for token_id, text in zip(stop_ids, tokenizer.token_texts(stop_ids), strict=True):
        if not text:
            continue
        pos = prefix_text.rfind(text)
        if pos > best_pos:
            best_pos, eot_id, eot_text = pos, token_id, text
    if eot_id is None:
        return None
    glue = prefix_text[best_pos + len(eot_text) :]
    if glue.strip():
        # Text after the last end-of-turn token means the assistant turn did not end with one (an
        # unusual template); splicing would duplicate or drop text, so tokenize fully instead.
        return None
    tail = full_text[len(prefix_text) :]
    # The turn was cut (max_tokens, a stop string): close it as the template does.
    close = [] if prior.ends_with_stop(stop_ids) else [eot_id]
    return TokenIds.joined(prior.prompt, prior.response_ids, close, tokenizer.encode(glue + tail))


#: Stands in for the content of the message after a reused turn, to find where that turn ends.
_MARK = "\u2063harnessrl-next-message\u2063"


def _turn_ends(tokenizer: PolicyTokenizer, text: str) -> list[tuple[int, int]]:
    """``(end position, token id)`` of every end-of-turn (stop-token) text in ``text``, in order."""
    ends: list[tuple[int, int]] = []
    for token_id in tokenizer.stop_token_ids:
        token_text = tokenizer.decode([token_id])
        if not token_text:
            continue
        start = text.find(token_text)
        while start >= 0:
            ends.append((start + len(token_text), token_id))
            start = text.find(token_text, start + len(token_text))
    return sorted(ends)


def splice_after_turn(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    n: int,
    prior: PriorCall,
    full_text: str,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> list[int] | None:
    """``history = "sampled"`` where the template rewrites earlier turns: the earlier call's prompt
    and sampled answer, then the text the template renders after that answer's turn ends.

    Where the turn ends is found structurally: the message after it is rendered with a marker for
    its content, and the turn ends at the last end-of-turn text before the marker. The splice is
    refused (``None``) unless the render has as many turn ends before that point as the earlier
    call's tokens (so no text the template put between turns is lost; end-of-turn texts the tokens
    spell with ordinary tokens may count) and the text from
    there to the marker reads the same in the real render, and unless the system messages after
    the turn leave the text before its end as it was (``_later_system_moves_back``).
    """
    if n + 1 >= len(messages) or messages[n + 1]["role"] == "assistant":
        return None
    marked = [*messages[: n + 1], {**messages[n + 1], "content": _MARK}, *messages[n + 2 :]]
    try:
        marked_text = tokenizer.render_chat(marked, tools=tools, add_generation_prompt=True, **kwargs)
    except Exception:  # a template may refuse the marked message (it checks the content)
        return None
    mark_at = marked_text.find(_MARK)
    if mark_at < 0 or marked_text.count(_MARK) != 1:
        return None
    ends_before = [end for end in _turn_ends(tokenizer, marked_text) if end[0] <= mark_at]
    stop_ids = set(tokenizer.stop_token_ids)
    closed = prior.ends_with_stop(stop_ids)
    sampled = (*prior.prompt_ids, *prior.response_ids)
    unclosed = 0 if closed else 1
    sampled_ends = sum(1 for token_id in sampled if token_id in stop_ids) + unclosed
    if not ends_before:
        return None
    if len(ends_before) != sampled_ends:
        # An answer may write an end-of-turn text with ordinary tokens ("<|endoftext|>" in code): the
        # render has that text where the answer is echoed back, and lacks it where the template
        # drops that part (earlier reasoning). Between the turn ends and all such texts of the
        # earlier tokens, then.
        spelled = len(_turn_ends(tokenizer, tokenizer.decode(sampled))) + unclosed
        if not sampled_ends < len(ends_before) <= spelled:
            return None
    end, eot_id = ends_before[-1]
    real_ends = _turn_ends(tokenizer, full_text)
    if len(real_ends) < len(ends_before):
        return None
    real_end, real_eot = real_ends[len(ends_before) - 1]
    between = marked_text[end:mark_at]  # glue and the next message's header
    if real_eot != eot_id or not full_text.startswith(between, real_end):
        return None
    if _later_system_moves_back(tokenizer, messages, n, full_text, real_end, tools, kwargs):
        return None
    # The turn was cut (max_tokens, a stop string): close it as the template does.
    close = [] if closed else [eot_id]
    return TokenIds.joined(prior.prompt, prior.response_ids, close, tokenizer.encode(full_text[real_end:]))


def _later_system_moves_back(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    n: int,
    full_text: str,
    turn_end: int,
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> bool:
    """Whether a system message after the reused turn ``messages[n]`` changes the text before that
    turn's end (``full_text[:turn_end]``, the full render's): then the earlier tokens lack it.

    DeepSeek's template gathers every system message into the header at the top, so an instruction
    added mid-rollout lands before the reused tokens, and a splice keeping them would silently drop
    it. The earlier tokens hold the render of ``messages[: n + 1]``'s header (a call whose header
    changed was encoded from its full render), so the check renders the conversation without the
    later system messages and compares the text before the turn's end. Tools and template kwargs,
    the rest of what a header is made of, are part of the match already (``find_prior``). Without a
    later system message there is nothing to check and nothing is rendered: the common case pays
    nothing.
    """
    later = messages[n + 1 :]
    if not any(m["role"] == "system" for m in later):
        return False
    without = [*messages[: n + 1], *(m for m in later if m["role"] != "system")]
    try:
        text = tokenizer.render_chat(without, tools=tools, add_generation_prompt=True, **kwargs)
    except Exception:  # a template may refuse the conversation without them: don't splice
        return True
    return not text.startswith(full_text[:turn_end])
