"""What the teacher's upstream is asked to sample: the policy path's limits applied to a harness's body.

``teacher_sampling`` puts the rollout's ``metadata.sampling`` and ``gateway.max_tokens`` on the body
the upstream gets (the recorded request stays the harness's); ``cap_max_tokens`` caps its answer
length fields; ``thinking_within_cap`` keeps an Anthropic thinking budget under a lowered
``max_tokens`` (native Messages mode).
"""

from __future__ import annotations

from typing import Any

from harnessrl.gateway.pipeline.limits import rollout_sampling
from harnessrl.schemas import Rollout

#: The fields of an upstream chat completion's answer length (the first is set when none is).
CHAT_LENGTH_FIELDS = ("max_tokens", "max_completion_tokens")


def cap_max_tokens(
    body: dict[str, Any], cap: int | None, fields: tuple[str, ...] = CHAT_LENGTH_FIELDS
) -> dict[str, Any]:
    """``body`` with its answer length (``fields``) capped at ``cap``, as the policy's calls are:
    harnesses ask for more than a teacher's context may hold (Claude Code 32000, Hermes 65536).
    Either field the harness set that is not an integer within the cap becomes the cap: a float
    (``65536.0``) or a string the upstream's parser would take as an integer must not slip past it."""
    if cap is None:
        return body
    out = dict(body)
    asked = [k for k in fields if out.get(k) is not None]
    for key in asked:
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, int) or value > cap:
            out[key] = cap
    if not asked:
        out[fields[0]] = cap
    return out


def teacher_sampling(
    body: dict[str, Any],
    rollout: Rollout,
    gateway_cap: int | None,
    fields: tuple[str, ...] = CHAT_LENGTH_FIELDS,
) -> dict[str, Any]:
    """``body`` as the upstream gets it, with what the policy path applies to every call
    (``pipeline.limits.sampling_params``): the rollout's ``metadata.sampling`` ``temperature`` and
    ``top_p`` replace the harness's, and its ``max_tokens`` caps the answer as ``gateway.max_tokens``
    does (the lower of the two). So an evaluation created greedy is answered greedy by the teacher
    too. The recorded request stays the harness's, as on the policy path. ``fields``: the body's
    answer-length fields (``max_tokens`` for Messages, ``max_output_tokens`` for Responses)."""
    overrides = rollout_sampling(rollout)  # 400 naming metadata.sampling if it is malformed
    caps = [cap for cap in (overrides.max_tokens, gateway_cap) if cap is not None]
    out = dict(cap_max_tokens(body, min(caps) if caps else None, fields))
    if overrides.temperature is not None:
        out["temperature"] = overrides.temperature
    if overrides.top_p is not None:
        out["top_p"] = overrides.top_p
    return out


#: The least ``thinking.budget_tokens`` Anthropic takes.
MIN_THINKING_BUDGET = 1024


def thinking_within_cap(body: dict[str, Any], asked: Any) -> dict[str, Any]:
    """A Messages ``body`` whose ``max_tokens`` the cap lowered from ``asked`` (the harness's), with an
    enabled thinking budget at or over the new ``max_tokens`` lowered to ``max_tokens - 1``: Anthropic
    refuses ``budget_tokens >= max_tokens`` with a 400, so a ``gateway.max_tokens`` (or the rollout's
    ``metadata.sampling.max_tokens``) under a harness's thinking budget (Claude Code asks for 32000
    tokens; its budget when it thinks is close to that) failed every call of the rollout. Not below Anthropic's least budget (1024): a cap that leaves no
    room for thinking is the upstream's to refuse. A harness's own budget is left as it asked."""
    thinking, cap = body.get("thinking"), body.get("max_tokens")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled" or cap == asked:
        return body
    budget = thinking.get("budget_tokens")
    if (
        isinstance(budget, int)
        and not isinstance(budget, bool)
        and isinstance(cap, int)
        and budget >= cap > MIN_THINKING_BUDGET
    ):
        return {**body, "thinking": {**thinking, "budget_tokens": cap - 1}}
    return body
