"""What a request must fit before it is generated: the prompt-size cap, the tokenizing time budget,
the vocabulary, and the sampling settings the engine gets (the rollout's overrides, the context).

Shared by every provider API (``pipeline.prepare`` and completions' own prompt): each check raises
the domain error (``BadRequest``, ``PayloadTooLarge``, ``ContextLengthExceeded``) naming the field,
and the API's error shape is chosen at the edge (``gateway.errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from pydantic import ValidationError

from harnessrl.engines.base import SamplingParams
from harnessrl.errors import BadRequest, ContextLengthExceeded, PayloadTooLarge
from harnessrl.gateway.body_models import SamplingFields
from harnessrl.gateway.prompt.repeats import HistoryBytes
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout, SamplingOverrides


def rollout_sampling(rollout: Rollout | None) -> SamplingOverrides:
    """The rollout's sampling overrides; ``BadRequest`` naming the field if they are malformed."""
    if rollout is None:
        return SamplingOverrides()
    try:
        return rollout.sampling
    except ValidationError as exc:
        raise BadRequest(
            f"rollout {rollout.rollout_id!r} has invalid metadata.sampling: {exc.errors()[0]['msg']}",
            param="metadata.sampling",
        ) from None


def sampling_params(
    state: GatewayState,
    body: SamplingFields,
    prompt_len: int,
    requested_max: int | None,
    rollout: Rollout | None = None,
    prompt_param: str = "messages",
) -> SamplingParams:
    """Sampling settings for the engine; 400 if the prompt plus ``max_tokens`` cannot fit the context
    (a prompt that fills it alone is blamed on ``prompt_param``, the body field that holds it).

    A rollout may carry ``SamplingOverrides`` set by whoever created it (the trainer): its
    ``temperature`` / ``top_p`` replace the harness's, and its ``max_tokens`` caps the harness's.
    That is how training runs sample at the temperature the trainer's logprobs assume and how
    evaluations run greedy, whatever the unmodified harness asks for.
    """
    overrides = rollout_sampling(rollout)
    for cap in (overrides.max_tokens, state.config.max_tokens):
        if cap is not None:
            requested_max = cap if requested_max is None else min(requested_max, cap)
    temperature = 1.0 if body.temperature is None else body.temperature
    if overrides.temperature is not None:
        temperature = overrides.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if overrides.top_p is not None:
        top_p = overrides.top_p
    context = state.engine.context_length
    room = context - prompt_len
    if room <= 0:
        raise ContextLengthExceeded(
            f"the prompt has {prompt_len} tokens; this model's context length is {context}",
            param=prompt_param,
        )
    if requested_max is not None:
        if requested_max > room:
            raise ContextLengthExceeded(
                f"the prompt has {prompt_len} tokens and max_tokens is {requested_max}; together they exceed "
                f"this model's context length of {context}",
                param="max_tokens",
            )
        max_tokens = requested_max
    else:
        max_tokens = min(room, state.config.default_max_tokens or room)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_token_ids=tuple(state.engine.tokenizer.stop_token_ids),
        seed=body.seed,
    )


#: Characters of request text per token of context the gateway tokenizes by default
#: (``gateway.max_prompt_chars`` unset): English averages about 4 per token, and a prompt of 16 per
#: token of the context can hardly fit it.
CHARS_PER_CONTEXT_TOKEN = 16


def prompt_char_limit(state: GatewayState) -> int:
    return state.config.max_prompt_chars or CHARS_PER_CONTEXT_TOKEN * state.engine.context_length


T = TypeVar("T")


async def tokenize_in_thread(state: GatewayState, fn: Callable[[], T], param: str) -> T:
    """Render and encode a prompt in a worker thread, within ``gateway.tokenize_timeout_s``.

    The size cap (``check_prompt_size``) bounds the text; the time budget bounds what the size cap
    cannot see (a template that loops over a long history, a tokenizer that is slow on some text).
    Past it the client gets a 413 and the event loop moves on; the thread cannot be stopped and
    finishes in the background, its result dropped.
    """
    budget = state.config.tokenize_timeout_s
    try:
        with anyio.fail_after(budget):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except TimeoutError:
        raise PayloadTooLarge(
            f"the prompt took more than {budget:g} s to tokenize (gateway.tokenize_timeout_s)",
            param=param,
        ) from None


def check_prompt_size(
    state: GatewayState,
    data: Any,
    param: str,
    history: HistoryBytes | None = None,
    rest_chars: int | None = None,
) -> int:
    """413 if the request carries more text than the gateway tokenizes for one call.

    Checked before anything is rendered or encoded: tokenizing an 8 MiB prompt took seconds of a
    worker thread and held the event loop up (``/api/health`` stalled for as long). Counts the
    characters of every string in the body (contents, tool definitions, arguments), in a loop
    rather than recursion, and stops as soon as the limit is passed.

    ``history``: the body's ``data[param]`` list as ``repeats.history_bytes`` encoded it, which has
    its count already; ``rest_chars``: the count of everything else, where known (the rest of the
    body is the same JSON as the last request's). Returns that count (0 without ``history``).
    """
    limit = prompt_char_limit(state)
    if history is None:
        _count_text(data, 0, limit, param)
        return 0
    listed = history.text_chars(len(history.ends))
    if rest_chars is None:
        rest_chars = _count_text([v for k, v in data.items() if k != param], listed, limit, param) - listed
    _count_text(None, listed + rest_chars, limit, param)
    return rest_chars


def _count_text(node: Any, total: int, limit: int, param: str) -> int:
    """``total`` plus the characters of every string in ``node``; ``PayloadTooLarge`` past ``limit``."""
    stack = [node]
    while True:
        if total > limit:
            raise PayloadTooLarge(
                f"the request has more than {limit} characters of text, the most this gateway "
                "tokenizes for one call (gateway.max_prompt_chars)",
                param=param,
            )
        if not stack:
            return total
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def check_token_ids(state: GatewayState, ids: list[int]) -> None:
    limit = state.engine.tokenizer.vocab_size
    bad = next((t for t in ids if not 0 <= t < limit), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the vocabulary (0..{limit - 1})", param="prompt")
