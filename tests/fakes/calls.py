"""A recorded call as scorers and the audit read it: its answer (``response``, in any provider's
shape) is what matters; the token ids are placeholders."""

from __future__ import annotations

from typing import Any

from harnessrl.schemas import Call


def answered_call(response: dict[str, Any], seq: int = 0) -> Call:
    return Call(
        rollout_id="r",
        seq=seq,
        response=response,
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )


def chat_call(text: str, seq: int = 0) -> Call:
    """A chat-completions call whose reply is ``text``."""
    return answered_call({"choices": [{"message": {"role": "assistant", "content": text}}]}, seq)
