"""Calls for store tests: ``make_call`` (a small valid one, fields overridable) and ``agent_trace``
(a rollout whose context grows call after call)."""

from __future__ import annotations

import random
from typing import Any

from harnessrl.schemas import Call, Usage


def make_call(rollout_id: str, **fields: Any) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=fields.pop("prompt_token_ids", [1, 2, 3]),
        response_token_ids=fields.pop("response_token_ids", [4, 5]),
        response_logprobs=fields.pop("response_logprobs", [-0.25, -1.5]),
        **fields,
    )


def agent_trace(rollout_id: str, calls: int, *, system: int, observation: int, answer: int) -> list[Call]:
    """A SWE-style rollout: a system prompt, then each call adds the last answer and an observation."""
    rng = random.Random(0)
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "parameters": {"type": "object"}}}
        for i in range(8)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s" * (4 * system)},
        {"role": "user", "content": "Fix the failing test."},
    ]
    prompt = [rng.randrange(150_000) for _ in range(system)]
    trace = []
    for _ in range(calls):
        response = [rng.randrange(150_000) for _ in range(answer)]
        call = Call(
            rollout_id=rollout_id,
            request={"model": "policy", "messages": list(messages), "tools": tools, "temperature": 1.0},
            response={"role": "assistant", "content": "a" * (4 * answer)},
            prompt_token_ids=list(prompt),
            response_token_ids=response,
            response_logprobs=[-rng.random() for _ in response],
            usage=Usage(prompt_tokens=len(prompt), completion_tokens=answer),
        )
        trace.append(call)
        messages += [
            {"role": "assistant", "content": "a" * (4 * answer)},
            {"role": "tool", "content": "o" * (4 * observation)},
        ]
        prompt = prompt + response + [rng.randrange(150_000) for _ in range(observation)]
    return trace
