"""``make_call``: a small valid ``Call`` for store tests (fields overridable)."""

from __future__ import annotations

from typing import Any

from harnessrl.schemas import Call


def make_call(rollout_id: str, **fields: Any) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=fields.pop("prompt_token_ids", [1, 2, 3]),
        response_token_ids=fields.pop("response_token_ids", [4, 5]),
        response_logprobs=fields.pop("response_logprobs", [-0.25, -1.5]),
        **fields,
    )
