"""A recorded call as scorers and the audit read it: its answer (``response``, in any provider's
shape) is what matters; the token ids are placeholders."""

from __future__ import annotations

import json
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


def tool_call(name: str, arguments: dict[str, Any], seq: int = 0) -> Call:
    """A chat call whose reply is one tool call (as the audit reads a harness's commands)."""
    call = {
        "id": f"c{seq}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return answered_call({"role": "assistant", "content": None, "tool_calls": [call]}, seq)


def bash_call(command: str, seq: int = 0) -> Call:
    """A chat call whose reply runs ``command`` through a ``bash`` tool."""
    return tool_call("bash", {"command": command}, seq)
