"""``POST /v1/responses`` in teacher mode: an OpenAI Responses call answered by the chat upstream.

The request is translated with the converter the policy path uses (``responses_input``:
instructions, message/reasoning/function_call/function_call_output items -> internal chat messages;
function tools; ``previous_response_id`` resolved from this rollout's recorded calls, as the policy
path resolves it) plus ``max_output_tokens`` -> ``max_tokens``, ``temperature``, ``top_p``,
``tool_choice``, ``parallel_tool_calls``, ``text.format`` (structured output) -> ``response_format``
and ``reasoning.effort`` -> ``reasoning_effort`` (both in OpenAI's chat API, vLLM's and SGLang's).
``reasoning.summary`` and ``text.verbosity`` are not sent; hosted tools are dropped or refused per
``gateway.unsupported_tools``.

The upstream's answer comes back as a Response object, whole or as the documented event sequence
(``response.created``, ``response.in_progress``, items added / deltas / done, then
``response.completed`` or ``response.incomplete``; ``sequence_number`` on each; a comment and
``response.in_progress`` again while the upstream gives nothing to send for ``keepalive_s``), built
by one ``response_items.ResponseItems`` for both: the upstream's reasoning as a ``reasoning`` item (text in ``content``
and ``summary``; ``encrypted_content`` when ``include`` asks, as the policy path gives it), its text
as a ``message`` item, each tool call as a ``function_call`` item with the upstream's call id (sent
whole when the call is complete, as the policy path does).

Recorded with ``api="responses"`` as the policy path records: the request as received (with the
resolved earlier conversation under ``PREVIOUS_KEY``), the internal assistant message with the
response id, before ``response.completed`` goes out. An upstream error is an OpenAI error before the
stream starts and a ``response.failed`` event after; either way nothing is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harnessrl.errors import BadRequest, HarnessRLError, UpstreamError
from harnessrl.gateway.apis.responses_input import (
    PREVIOUS_KEY,
    request_to_internal,
)
from harnessrl.gateway.apis.responses_request import ResponsesRequest, resolve_previous
from harnessrl.gateway.apis.responses_tools import unsupported_tools
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import parse_body, read_body, validate_body
from harnessrl.gateway.pipeline.delivery import CLIENT_GONE_STATUS
from harnessrl.gateway.pipeline.wire import SSE_HEADERS, json_response
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.native import native_responses
from harnessrl.gateway.teacher.recording import call_headers, record, unless_client_leaves
from harnessrl.gateway.teacher.response_items import ResponseItems, ResponseShell
from harnessrl.gateway.teacher.sampling import teacher_sampling
from harnessrl.gateway.teacher.stream import ChatStream, Pacer, open_stream, whole_chunk
from harnessrl.gateway.teacher.upstream import Teacher, complete
from harnessrl.schemas import Rollout, now

log = logging.getLogger("harnessrl.gateway")

__all__ = ["chat_request", "teacher_responses"]


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice if choice in ("auto", "none", "required") else None


def chat_request(data: dict[str, Any], body: ResponsesRequest) -> dict[str, Any]:
    """The chat.completions body of a Responses request (its earlier conversation resolved)."""
    messages, tools = request_to_internal(data)
    if not messages:
        raise BadRequest("input is required (a string or a non-empty list of items)", param="input")
    out: dict[str, Any] = {"messages": messages}
    if tools:
        out["tools"] = tools
        if _tool_choice(body.tool_choice) is not None:
            out["tool_choice"] = _tool_choice(body.tool_choice)
        if body.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = body.parallel_tool_calls
    if body.max_output_tokens is not None:
        out["max_tokens"] = body.max_output_tokens
    for key in ("temperature", "top_p"):
        if data.get(key) is not None:
            out[key] = data[key]
    response_format = _response_format(body.text)
    if response_format is not None:
        out["response_format"] = response_format
    effort = (body.reasoning or {}).get("effort")
    if isinstance(effort, str):
        out["reasoning_effort"] = effort
    return out


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """Responses' ``text.format`` as chat's ``response_format`` (structured output), None for plain
    text; a format chat cannot say is refused rather than dropped (the harness relies on it)."""
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema" and isinstance(fmt.get("name"), str):
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(f"text.format {fmt.get('type')!r} is not supported in teacher mode", param="text.format")


async def teacher_responses(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/responses`` answered by the teacher; raises ``HarnessRLError``s the app's handlers
    answer in OpenAI's shape."""
    if teacher.api == "native":  # forwarded to the upstream's own /responses
        return await native_responses(request, teacher)
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = parse_body(await read_body(request, state.config.max_body_bytes))
    body = validate_body(ResponsesRequest, data)
    body.check_n()
    if state.config.unsupported_tools == "refuse" and (found := unsupported_tools(data)):
        raise BadRequest(
            "tools this gateway cannot serve: " + ", ".join(found) + " (gateway.unsupported_tools = refuse)",
            param=found[0].split(" ")[0],
        )
    if PREVIOUS_KEY in data:
        raise BadRequest(f"{PREVIOUS_KEY} is reserved", param=PREVIOUS_KEY)
    recorded = data
    if body.previous_response_id:
        previous = await resolve_previous(state, rollout, body.previous_response_id)
        recorded = {**data, PREVIOUS_KEY: previous}  # so the converter alone rebuilds it later
    chat = teacher_sampling(chat_request(recorded, body), rollout, state.config.max_tokens)  # 400s first
    rollout = await open_rollout(state, rollout)
    shell = ResponseShell(body, body.model or teacher.model, chat.get("tools"))
    encrypt = "reasoning.encrypted_content" in (body.include or [])
    started_at = now()
    if not body.stream:
        answer = await unless_client_leaves(
            request, state, rollout, "responses", lambda: complete(teacher, chat, state.config.max_body_bytes)
        )
        if answer is None:
            return Response(status_code=CLIENT_GONE_STATUS)
        items = ResponseItems(encrypt)
        try:
            items.feed(whole_chunk(answer))
        except (KeyError, TypeError, AttributeError):
            raise UpstreamError("teacher upstream answered 200 without a chat completion") from None
        status = items.status()
        items.finish(status)
        message, finish = items.recorded(shell.id)
        stored = await record(
            state, rollout, "responses", recorded, message, finish, items.sum.usage, started_at, None
        )
        return json_response(shell.response(status, items), headers=call_headers(stored))
    upstream = await open_stream(request, state, rollout, "responses", teacher, chat)
    if upstream is None:
        return Response(status_code=CLIENT_GONE_STATUS)
    return StreamingResponse(
        _relay(state, rollout, recorded, upstream, shell, encrypt, started_at),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "x-harnessrl-rollout-id": rollout.rollout_id},
    )


async def _relay(
    state: GatewayState,
    rollout: Rollout,
    recorded: dict[str, Any],
    upstream: ChatStream,
    shell: ResponseShell,
    encrypt: bool,
    started_at: float,
) -> AsyncIterator[str]:
    """The Responses event sequence from the upstream's chunks; the final event after the record."""
    items = ResponseItems(encrypt)
    try:
        in_progress = shell.response("in_progress")
        yield shell.event({"type": "response.created", "response": in_progress})
        yield shell.event({"type": "response.in_progress", "response": in_progress})
        # While the upstream gives nothing to send: a comment and ``response.in_progress`` again, as
        # the policy path does (Codex's idle timer counts events, not comments).
        pacer = Pacer(state.keepalive_s)
        async for item in upstream.paced(state.keepalive_s):
            events = items.feed(item[1]) if item is not None else []
            for event in events:
                yield shell.event(event)
            if events or pacer.due():
                if not events:
                    yield ": waiting for the teacher\n\n"
                    yield shell.event({"type": "response.in_progress", "response": in_progress})
                pacer.sent()
        status = items.status()
        for event in items.finish(status):
            yield shell.event(event)
        message, finish = items.recorded(shell.id)
        await record(
            state,
            rollout,
            "responses",
            recorded,
            message,
            finish,
            items.sum.usage,
            started_at,
            upstream.first_token_at,
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield shell.event({"type": kind, "response": shell.response(status, items)})
    except HarnessRLError as exc:  # its 200 was sent: the error is the stream's last event
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield shell.event({"type": "response.failed", "response": shell.response("failed", items, exc)})
    finally:
        await upstream.aclose()
