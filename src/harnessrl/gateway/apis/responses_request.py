"""What a Responses API request is, for every gateway path that reads one: the fields the gateway
reads (``ResponsesRequest``), where a recorded answer keeps the response id it was given
(``RESPONSE_ID_KEY``) and how ``previous_response_id`` resolves to the rollout's recorded
conversation (``resolve_previous``).

Shared by the policy's handler (``apis.responses``) and teacher mode (``gateway.teacher``), which
is why it is not in either: each imports it, neither imports the other.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from harnessrl.errors import BadRequest
from harnessrl.gateway.apis.responses_input import request_to_internal
from harnessrl.gateway.bodies import SamplingFields
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
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


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
