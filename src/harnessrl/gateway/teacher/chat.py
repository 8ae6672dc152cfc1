"""``POST /v1/chat/completions`` in teacher mode: the upstream's answer passed through as it is.

The body is checked as the policy path checks it (``n``, ``echo``, ``continue_final_message``,
``add_generation_prompt``, ``chat_template``: 400s, so the recorded answer is the one new assistant
turn the harness was given) and goes to the upstream as received (``model`` replaced, the rollout's
``metadata.sampling`` and ``gateway.max_tokens`` applied: ``teacher_sampling``); the harness gets the upstream's
answer in its own shape: the whole JSON, or its SSE chunks as they arrive (text, reasoning,
tool-call deltas and their ids untouched). A streamed call asks the upstream for usage; the
usage-only chunk reaches the harness only if it asked for it too. The closing ``[DONE]`` is sent
after the record. Errors: an upstream 4xx keeps its status, anything else is a 502; a stream cut
before it finished ends with an SSE error event. Neither is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import StrictBool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harnessrl.errors import HarnessRLError
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import parse_body, read_body, validate_body
from harnessrl.gateway.body_models import ChatTurn, StreamOptions
from harnessrl.gateway.errors import sse_error
from harnessrl.gateway.pipeline.delivery import CLIENT_GONE_STATUS
from harnessrl.gateway.pipeline.wire import DONE, SSE_HEADERS, json_response
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.recording import (
    NO_FINISH_REASON,
    answer_message,
    call_headers,
    record,
    unless_client_leaves,
)
from harnessrl.gateway.teacher.sampling import teacher_sampling
from harnessrl.gateway.teacher.stream import ChatStream, open_stream
from harnessrl.gateway.teacher.upstream import Teacher, complete
from harnessrl.schemas import Rollout, now

log = logging.getLogger("harnessrl.gateway")

__all__ = ["teacher_chat"]


class TeacherChatTurn(ChatTurn):
    """``ChatTurn`` and the two fields the gateway itself acts on, checked as the policy path checks
    them: ``stream`` (a string such as ``"false"`` was a stream) and ``stream_options`` (not an
    object, it was a 500 ``TypeError`` before the upstream was asked)."""

    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None


#: An SSE comment: keeps the connection (and a harness's idle timer) alive while the upstream is silent.
KEEPALIVE = ": waiting for the teacher\n\n"


async def teacher_chat(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/chat/completions`` answered by the teacher; raises ``HarnessRLError``s the app's
    handlers answer in OpenAI's shape."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = parse_body(await read_body(request, state.config.max_body_bytes))
    # The policy path's checks of what the answer is (400s before the rollout starts): one choice
    # (only one is recorded), a new assistant turn after the whole conversation (no continuation, no
    # echo, the model's own template), so the recorded answer is the turn the harness was given.
    turn = validate_body(TeacherChatTurn, data)
    turn.check_n()
    rollout = await open_rollout(state, rollout)
    # Else as received (``model`` replaced).
    body = teacher_sampling(data, rollout, state.config.max_tokens)
    started_at = now()
    if not turn.stream:
        answer = await unless_client_leaves(
            request,
            state,
            rollout,
            "chat.completions",
            lambda: complete(teacher, body, state.config.max_body_bytes),
        )
        if answer is None:
            return Response(status_code=CLIENT_GONE_STATUS)
        choice = answer["choices"][0]
        stored = await record(
            state,
            rollout,
            "chat.completions",
            data,
            answer_message(choice["message"]),
            choice.get("finish_reason") or NO_FINISH_REASON,
            answer.get("usage"),
            started_at,
            None,
        )
        return json_response(answer, headers=call_headers(stored))
    upstream = await open_stream(request, state, rollout, "chat.completions", teacher, body)
    if upstream is None:
        return Response(status_code=CLIENT_GONE_STATUS)
    wants_usage = bool(turn.stream_options and turn.stream_options.include_usage)
    return StreamingResponse(  # an event stream, as the policy path's: SSE clients check the type
        _relay(state, rollout, data, upstream, wants_usage, started_at),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "x-harnessrl-rollout-id": rollout.rollout_id},
    )


async def _relay(
    state: GatewayState,
    rollout: Rollout,
    data: dict[str, Any],
    upstream: ChatStream,
    wants_usage: bool,
    started_at: float,
) -> AsyncIterator[str]:
    """The upstream's chunks as they come; ``[DONE]`` only after the call is recorded."""
    try:
        async for item in upstream.paced(state.keepalive_s):
            if item is None:
                yield KEEPALIVE
                continue
            payload, chunk = item
            if chunk.get("choices") or wants_usage:
                yield f"data: {payload}\n\n"
        message = upstream.message
        assert message.finish_reason is not None  # ChatStream raises on a stream that did not finish
        await record(
            state,
            rollout,
            "chat.completions",
            data,
            message.message(),
            message.finish_reason,
            message.usage,
            started_at,
            upstream.first_token_at,
        )
        yield DONE
    except HarnessRLError as exc:  # its 200 was sent: the error is the stream's last event
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield sse_error(exc)
    finally:
        await upstream.aclose()
