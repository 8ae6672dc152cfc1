"""The ends the OpenAI-shaped APIs (chat completions, legacy completions) share: the answer and
chunk envelope, usage, and logprob entries without the sampled stop tokens."""

from __future__ import annotations

import secrets
import time
from typing import Any

from harnessrl.gateway.pipeline.calls import PreparedCall


def openai_usage(call: PreparedCall) -> dict[str, int]:
    gen = call.generation
    completion = len(gen.token_ids) if gen else 0
    return {
        "prompt_tokens": len(call.prompt_ids),
        "completion_tokens": completion,
        "total_tokens": len(call.prompt_ids) + completion,
    }


def openai_envelope(id_prefix: str, obj: str, model: str, policy_version: int) -> dict[str, Any]:
    """The fields every OpenAI answer and stream chunk starts with."""
    return {
        "id": f"{id_prefix}-{secrets.token_hex(12)}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"harnessrl-policy-{policy_version}",
    }
