"""What a Responses API request is, for every gateway path that reads one: the fields the gateway
reads (``ResponsesRequest``), where a recorded answer keeps the response id it was given
(``RESPONSE_ID_KEY``), how ``previous_response_id`` resolves to the rollout's recorded
conversation (``resolve_previous``), and the Response object that echoes the request around its
output (``response_object``).

Shared by the policy's handler (``apis.responses``) and teacher mode (``gateway.teacher``), which
is why it is not in either: each imports it, neither imports the other.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, ValidationInfo, field_validator

from harnessrl.errors import BadRequest, HarnessRLError
from harnessrl.gateway.apis.responses_input import request_to_internal
from harnessrl.gateway.apis.responses_tools import tool_is_function
from harnessrl.gateway.body_models import JsonInt, SamplingFields
from harnessrl.gateway.errors import error_shape
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import Rollout

#: Private key of the recorded internal answer that holds the response id given to the client.
RESPONSE_ID_KEY = "_response_id"


class ResponsesRequest(SamplingFields):
    """The fields this gateway reads; everything else (``store``, ``metadata``, ``text``, ``include``,
    ``prompt_cache_key``, ``service_tier``, ``user``...) is accepted and echoed or ignored."""

    input: str | list[Any] | None = None
    instructions: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: JsonInt | None = Field(default=None, ge=1)
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    store: StrictBool | None = None
    # OpenAI's server-side state this gateway does not keep: honoured there, they put a stored
    # conversation's items or a stored prompt's instructions before the input. Ignored, the policy
    # answered without them and training saw a conversation the harness never had: refused.
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None

    @field_validator("conversation", "prompt")
    @classmethod
    def _no_server_side_state(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(
                f"not supported: this gateway keeps no stored {info.field_name}s; send its items in "
                "'input' (and its instructions in 'instructions') instead"
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _a_tool_choice_openai_takes(cls, value: Any, info: ValidationInfo) -> Any:
        """As chat's: ``none``, ``auto``, ``required`` or ``{"type": "function", "name": N}`` naming
        one of the function tools (a misspelled value was taken as ``auto``); ``required`` needs
        tools. Choices of hosted tools (``{"type": "web_search"}``...) go with
        those tools (``gateway.unsupported_tools``). Accepted, not enforced: the policy samples freely."""
        if value is None or value in ("none", "auto"):
            return value
        if isinstance(value, str) and value != "required":
            raise ValueError(f"must be 'none', 'auto', 'required' or a named function, got {value!r}")
        if isinstance(value, dict) and value.get("type") != "function":
            return value
        if not info.data.get("tools"):
            raise ValueError("is only allowed when tools are given")
        if isinstance(value, dict):
            name = value.get("name")
            if not isinstance(name, str):
                raise ValueError('a named choice is {"type": "function", "name": ...}')
            if name not in {t["name"] for t in info.data["tools"] if tool_is_function(t)}:
                raise ValueError(f"names the function {name!r}, which is not among the function tools")
        return value


async def resolve_previous(state: GatewayState, rollout: Rollout, response_id: str) -> list[dict[str, Any]]:
    """The conversation ``previous_response_id`` continues: its input (without its instructions, which
    OpenAI does not carry over) and its answer, from the recorded call."""
    calls = await state.in_thread(lambda: state.store.list_calls(rollout.rollout_id, attempt=rollout.attempt))
    for call in reversed(calls):
        if call.api == "responses" and call.response.get(RESPONSE_ID_KEY) == response_id:
            messages, _ = request_to_internal({**call.request, "instructions": None})
            answer = {k: v for k, v in call.response.items() if k != RESPONSE_ID_KEY}
            return messages + [answer]
    raise BadRequest(
        f"previous_response_id {response_id!r} is not a response of this rollout",
        param="previous_response_id",
    )


def response_object(
    body: ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    tools: list[dict[str, Any]],
    temperature: float | None,
    top_p: float | None,
    error: HarnessRLError | None = None,
) -> dict[str, Any]:
    """The Response object: ``output`` and ``usage`` inside what the request asked for, echoed
    (``tools`` are the request's function tools in chat's shape)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": {"code": error_shape(error).code, "message": str(error)} if error is not None else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.parallel_tool_calls if body.parallel_tool_calls is not None else True,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": (body.reasoning or {}).get("effort"), "summary": None},
        "store": body.store if body.store is not None else True,
        "temperature": temperature,
        "top_p": top_p,
        "text": body.text or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": [{"type": "function", **t["function"]} for t in tools],
        "truncation": "disabled",
        "usage": usage,
        "metadata": body.metadata or {},
    }
