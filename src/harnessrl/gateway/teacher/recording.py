"""Recording a teacher's answered call, as the policy path records its own: ``record`` makes it durable
(``Call.request`` as the harness sent it, ``Call.response`` one internal (OpenAI chat) assistant
message, finish reason, usage, timing, no token ids: the teacher's tokens are not the student's), and
only one the harness is still there for (``unless_client_leaves``). What ``harnessrl sft`` trains on
is decided by the finish reason (``NATURAL_ENDINGS``, ``NO_FINISH_REASON``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from harnessrl.gateway.errors import RolloutClosed
from harnessrl.gateway.pipeline.delivery import watching_client
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Call, Rollout, Usage, now
from harnessrl.store.base import RolloutEnded

T = TypeVar("T")

#: The finish reasons (chat's terms) of an answer that ended where its model chose to. Every other
#: value a teacher's answer is recorded with (``length``, ``content_filter``, Anthropic's
#: ``refusal`` or ``pause_turn``, an unfinished Response's status...) says it was cut, and ``harnessrl
#: sft`` never trains on it (``sft.render.answer_skip``).
NATURAL_ENDINGS = frozenset({"stop", "tool_calls", "function_call"})

#: What a whole answer whose upstream named no finish reason is recorded with (a stream without one
#: fails): the upstream did not say the answer ended where its model chose to, so ``harnessrl sft``
#: does not train it as a finished one (recorded as ``stop``, it did). The harness is told what it
#: was before (chat: the upstream's answer as it came; Messages ``end_turn``; Responses ``completed``).
NO_FINISH_REASON = "no_finish_reason"


def answer_message(message: dict[str, Any]) -> dict[str, Any]:
    """The recorded assistant message of an upstream's ``choices[0].message`` (sft's shape)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        out["reasoning_content"] = reasoning
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


async def unless_client_leaves(
    request: Request, state: GatewayState, rollout: Rollout, api: str, fetch: Callable[[], Awaitable[T]]
) -> T | None:
    """``await fetch()`` (the upstream's whole answer), or ``None`` if the harness's client left
    first: the upstream request is cancelled, nothing is recorded and the call is counted as
    dropped (``client_gone``). A client leaving after the answer came is the policy path's window
    too (its answer is recorded, then sent)."""
    answer: T | None = None
    with anyio.CancelScope() as scope:
        async with watching_client(request.scope, request.receive, scope.cancel):
            answer = await fetch()
    if scope.cancelled_caught:
        state.count_drop(rollout.rollout_id, api, "client_gone", ())
        return None
    return answer


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def usage_counts(usage: Any) -> dict[str, Any] | None:
    """An upstream's chat ``usage`` with every count a non-negative integer (one that is not counts 0,
    a details object that is not one is left out); ``None`` if it is not an object. Usage is
    bookkeeping: a malformed one used to fail the answer in the middle of its delivery (a 500, or a
    stream cut without an error event) and leave nothing recorded."""
    if not isinstance(usage, dict):
        return None
    out: dict[str, Any] = {k: _count(usage.get(k)) for k in ("prompt_tokens", "completion_tokens")}
    for key in ("prompt_tokens_details", "completion_tokens_details"):
        details = usage.get(key)
        if isinstance(details, dict):
            out[key] = {k: _count(v) for k, v in details.items()}
    return out


async def record(
    state: GatewayState,
    rollout: Rollout,
    api: str,
    data: dict[str, Any],
    response: dict[str, Any],
    finish_reason: str,
    usage: dict[str, Any] | None,
    started_at: float,
    first_token_at: float | None,
) -> Call:
    """Make the teacher's answered call durable (before the harness has all of it)."""
    usage = usage_counts(usage) or {}
    call = Call.model_construct(
        rollout_id=rollout.rollout_id,
        attempt=rollout.attempt,
        api=api,
        request=data,
        response=response,
        prompt_token_ids=[],
        response_token_ids=[],
        response_logprobs=[],
        policy_version=0,
        finish_reason=finish_reason if isinstance(finish_reason, str) else str(finish_reason),
        usage=Usage(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        ),
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=now(),
        call_id=None,
    )
    try:
        stored = await state.writer.add(call)
    except RolloutEnded:  # ended by someone this gateway did not hear: refused, as the policy path does
        raise RolloutClosed(f"rollout {rollout.rollout_id!r} ended; it takes no more calls") from None
    state.metrics.count_answered(stored.api, stored)  # as the policy path counts its calls
    return stored


def call_headers(stored: Call) -> dict[str, str]:
    return {"x-harnessrl-rollout-id": stored.rollout_id, "x-harnessrl-call-seq": str(stored.seq)}
