"""Chat messages -> prompt token IDs, reusing the exact tokens the policy sampled earlier.

Pure functions (no I/O), so the property the whole project rests on is unit-testable: for a
harness that only appends to its history, call k+1's prompt starts with call k's prompt followed by
call k's sampled response, token for token.

The algorithm (``build_prompt``):

1. Normalize the messages (content parts -> one string, ``None`` -> "", tool-call arguments -> a
   JSON object when they parse, ``developer`` -> ``system``) and render the whole conversation with
   the policy's chat template and generation prompt: ``T_full``.
2. Among this rollout's earlier calls rendered with the same tools and template kwargs
   (``messages.template_key``: a tool added mid-rollout changes the system header of the whole
   prompt), find the one with the most messages such that the new ``messages[:n]`` equal its
   messages and ``messages[n]`` is semantically the assistant message it answered (same stripped
   text; same tool calls by name and parsed arguments; ids ignored).
3. Render ``messages[:n+1]`` without generation prompt: ``T_prefix``. If ``T_full`` starts with
   it, the new text is ``tail = T_full[len(T_prefix):]``, and ``glue`` is whatever the template
   put after the assistant turn's end-of-turn token (``"\\n"`` for ChatML).
4. prompt = earlier prompt + earlier response (+ the end-of-turn token if the sampled response did
   not end with a stop token, e.g. it hit ``max_tokens`` or a stop string) + encode(glue + tail).

Where ``T_full`` does not start with ``T_prefix`` (the template rewrites earlier turns), the tail is
taken after the turn's end instead (``splice.splice_after_turn``), unless a system message after the turn
changes the text before it (DeepSeek's template gathers them into the header).

Anything that does not line up falls back to ``encode(T_full)``; the result says which path was
taken (``reused``, ``first``, ``no_match``, ``mismatch``) for the metrics.

Incremental rendering (the default). Steps 1 and 3 render the whole conversation twice, which
makes every call O(context) even though only ``glue + tail`` is encoded. When the new messages
after the matched assistant turn contain no assistant turn (the append-only common case: tool
results, a user message), ``T_prefix``/``T_full`` are rendered from a short *surrogate*
conversation instead: the leading system message (it carries the tools header), the message before
the matched assistant turn, that turn, and the new messages. New messages with a system message
among them take the full path: some templates (DeepSeek's) gather every system message into the
header at the top, so such a message changes text before the reused tokens (even an empty one
adds a separator there). A system message before the matched turn is in both surrogate renders
alike, so leaving it out changes nothing after the turn. The tail depends only on these local
neighbours in the templates we know, but chat templates are not compositional in general, so the
first ``VERIFY_CALLS`` incremental splices are also computed the full way and compared; one
difference turns incremental rendering off for good. That record is a ``SpliceTrust``, passed in by
whoever owns the tokenizer (the gateway keeps one, ``history.CallHistory.trust``): these functions
hold no state of their own. Any failure
of the surrogate path (template error, prefix mismatch) falls back to the full path above, so the
prompt IDs are always the full path's. ``quick_prompt`` is that trusted incremental path alone: cheap
enough (a few short renders, one short encode) for the gateway to run on its event loop, sending only
the rest to a thread.

Normalizing and fingerprinting (step 2) is O(context) as well; ``messages.key_messages`` makes it
O(new messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harnessrl.gateway.prompt.messages import (
    NO_TEMPLATE_CONTEXT,
    PriorCall,
    TemplateKey,
    kwargs_json,
    message_key,
)
from harnessrl.gateway.prompt.splice import splice, splice_after_turn, splice_incremental

if TYPE_CHECKING:
    from harnessrl.tokenizer import PolicyTokenizer


@dataclass(frozen=True)
class PromptPlan:
    prompt_ids: list[int]
    result: str  # reused | first | no_match | mismatch
    reused_tokens: int = 0  # how many leading tokens were taken from an earlier call verbatim


def find_prior(
    keys: Sequence[bytes], priors: Iterable[PriorCall], template_key: TemplateKey = NO_TEMPLATE_CONTEXT
) -> PriorCall | None:
    """The earlier call with the most messages whose history and answer this conversation continues,
    among those rendered with the same tools and template kwargs (``template_key``)."""
    best: PriorCall | None = None
    for prior in priors:
        n = len(prior.message_keys)
        if n >= len(keys) or (best is not None and n < len(best.message_keys)):
            continue
        if (
            keys[n] == prior.answer_key
            and prior.template_key == template_key
            and tuple(keys[:n]) == prior.message_keys
        ):
            best = prior  # ties go to the later call
    return best


def prompt_template_key(
    tokenizer: PolicyTokenizer, tools: Any, template_kwargs: dict[str, Any] | None
) -> TemplateKey:
    """``messages.template_key`` of a call's tools and template kwargs; for tools the tokenizer
    prepared (``template_tools``, as the gateway passes them) the JSON they were kept by, no
    encoding: the usual call pays for the kwargs' few bytes only."""
    return (tokenizer.tools_json(tools), kwargs_json(template_kwargs))


def build_prompt(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    priors: Iterable[PriorCall] = (),
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    incremental: bool = True,
    keys: Sequence[bytes] | None = None,
    history: str = "sampled",
    trust: SpliceTrust | None = None,
) -> PromptPlan:
    """Prompt token IDs for ``messages`` (already normalized), splicing in earlier sampled tokens.

    ``incremental=False`` always renders the whole conversation (the reference path). ``keys``: the
    messages' ``message_key``s if already computed (``key_messages``). ``history="as_rendered"``:
    the prompt is what the template renders, as a deployed server would tokenize it (no splice).
    ``trust``: how far incremental splices with this tokenizer are verified (a fresh one, which
    verifies every splice the full way, when not given)."""
    trust = SpliceTrust() if trust is None else trust
    kwargs = template_kwargs or {}
    if history == "as_rendered":
        text = tokenizer.render_chat(list(messages), tools=tools, add_generation_prompt=True, **kwargs)
        return PromptPlan(tokenizer.encode_conversation(text), "as_rendered")
    priors = list(priors)
    keys = [message_key(m) for m in messages] if keys is None else keys
    prior = find_prior(keys, priors, prompt_template_key(tokenizer, tools, kwargs)) if priors else None
    if prior is not None and incremental and not trust.refuted:
        spliced = splice_incremental(tokenizer, messages, prior, tools, kwargs)
        if spliced is not None:
            if trust.trusted:
                return PromptPlan(spliced, "reused", prior.token_count)
            full = build_prompt(
                tokenizer,
                messages,
                [prior],
                tools=tools,
                template_kwargs=kwargs,
                incremental=False,
                keys=keys,
            )
            trust.verify(full.prompt_ids == spliced)
            return full
    full_text = tokenizer.render_chat(list(messages), tools=tools, add_generation_prompt=True, **kwargs)
    if prior is None:
        return PromptPlan(tokenizer.encode_conversation(full_text), "no_match" if priors else "first")
    n = len(prior.message_keys)
    prefix_text = tokenizer.render_chat(
        list(messages[: n + 1]), tools=tools, add_generation_prompt=False, **kwargs
    )
    spliced = splice(tokenizer, prior, prefix_text, full_text)
    if spliced is None:
        # The template renders the shared history differently once more turns follow (Qwen3 drops
        # the reasoning of earlier turns): keep the sampled tokens, add what follows the turn.
        spliced = splice_after_turn(tokenizer, messages, n, prior, full_text, tools, kwargs)
    if spliced is None:
        return PromptPlan(tokenizer.encode_conversation(full_text), "mismatch")
    return PromptPlan(spliced, "reused", prior.token_count)


def quick_prompt(
    tokenizer: PolicyTokenizer,
    messages: Sequence[dict[str, Any]],
    priors: Iterable[PriorCall],
    keys: Sequence[bytes],
    *,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    history: str = "sampled",
    trust: SpliceTrust | None = None,
) -> PromptPlan | None:
    """``build_prompt``'s result when it comes from a trusted incremental splice, else ``None``.

    The cheap case only: a few renders of a short surrogate conversation and one encode of the new
    tail. Everything that renders or encodes the whole conversation (no match, a splice still being
    verified, a failed splice) returns ``None`` for ``build_prompt`` to do, off the event loop; so
    does a new tail of ``QUICK_TAIL_CHARS`` or more (a tool printed a large file: encoding 2 M
    characters takes seconds, and the event loop serves every other rollout meanwhile).
    """
    if history != "sampled" or trust is None or not trust.trusted:
        return None
    prior = find_prior(keys, priors, prompt_template_key(tokenizer, tools, template_kwargs))
    if prior is None:
        return None
    if sum(len(m["content"]) for m in messages[len(prior.message_keys) + 1 :]) >= QUICK_TAIL_CHARS:
        return None  # a long new message (a big tool output) is rendered and encoded in a thread too
    spliced = splice_incremental(tokenizer, messages, prior, tools, template_kwargs or {})
    if spliced is None:
        return None
    return PromptPlan(spliced, "reused", prior.token_count)


#: Incremental splices checked against the full path before the incremental path is trusted.
VERIFY_CALLS = 2
#: Characters of new messages past which ``quick_prompt`` leaves the splice to a worker thread (where
#: ``PolicyTokenizer.encode`` releases the GIL from ``GIL_FREE_ENCODE_CHARS`` on, the same number).
QUICK_TAIL_CHARS = 32_768


class SpliceTrust:
    """How far incremental splices with one tokenizer (one chat template) have been verified:
    ``VERIFY_CALLS`` agreeing with the full path trust it; one disagreeing refutes it for good."""

    def __init__(self) -> None:
        self.checks = 0  # splices verified so far; -1 once one differed from the full path

    @property
    def trusted(self) -> bool:
        return self.checks >= VERIFY_CALLS

    @property
    def refuted(self) -> bool:
        return self.checks < 0

    def verify(self, agreed: bool) -> None:
        """Count one splice checked against the full path."""
        if not self.refuted:
            self.checks = self.checks + 1 if agreed else -1
