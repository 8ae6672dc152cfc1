"""Teacher mode with ``engine.teacher.api = "native"``: Messages and Responses calls forwarded to the
upstream's own ``/messages`` and ``/responses`` (Anthropic's API for Claude Code, OpenAI's for Codex).

Where ``teacher.messages``/``teacher.responses`` translate to chat, this keeps what only the
provider's own API carries: Anthropic's thinking blocks with their real signatures (which Anthropic
checks when the harness sends them back), beta features the harness asks for (``anthropic-beta``),
OpenAI's encrypted reasoning and server-side state. The body goes as received (``model`` replaced,
the rollout's ``metadata.sampling`` and ``gateway.max_tokens`` applied: ``teacher_sampling``, with a
Messages thinking budget the lowered ``max_tokens`` no longer holds lowered under it; a
Messages conversation that ends with an assistant message, a prefill, is refused as the policy path
refuses it); the upstream's answer reaches the harness as it
sent it: the whole JSON, or its SSE events line by line. The key goes as ``x-api-key`` to
``/messages`` and as a bearer token to ``/responses``; the harness's ``anthropic-version`` and
``anthropic-beta`` headers are passed on.

Recorded as the policy path records each API: the request as received (a Responses request that
continues ``previous_response_id`` with the earlier conversation resolved from the rollout's
recorded calls, as the policy path does), and the internal assistant message the answer reads back
to — its content blocks (``anthropic_convert.message_of_blocks``), or its output items (``responses_input``) with the
response id — before the stream's final event (``message_stop``, ``response.completed``) is passed
on. A stream that ends without it, or with an error event, is not recorded; the harness then gets the
API's error event. A lone UTF-16 surrogate in the upstream's JSON (``"\\ud83d"``: a string cut inside
an emoji) is U+FFFD in both what the harness gets and what is recorded (``surrogates_replaced``),
as on the translated paths.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from harnessrl.errors import BadRequest, HarnessRLError, UpstreamError
from harnessrl.gateway.apis.anthropic_convert import refuse_prefill
from harnessrl.gateway.apis.anthropic_request import MessagesRequest
from harnessrl.gateway.apis.responses_input import PREVIOUS_KEY
from harnessrl.gateway.apis.responses_request import ResponsesRequest, resolve_previous
from harnessrl.gateway.auth import authorize_rollout, open_rollout
from harnessrl.gateway.bodies import parse_body, read_body, validate_body
from harnessrl.gateway.errors import anthropic_sse_error, error_shape
from harnessrl.gateway.pipeline.delivery import CLIENT_GONE_STATUS
from harnessrl.gateway.pipeline.wire import SSE_HEADERS, sse_event
from harnessrl.gateway.state import GatewayState
from harnessrl.gateway.teacher.native_answers import messages_answer, responses_answer
from harnessrl.gateway.teacher.reading import bounded_lines, read_bounded, without_surrogates
from harnessrl.gateway.teacher.recording import call_headers, record, unless_client_leaves
from harnessrl.gateway.teacher.sampling import teacher_sampling, thinking_within_cap
from harnessrl.gateway.teacher.upstream import ANTHROPIC_VERSION, Teacher, upstream_error
from harnessrl.schemas import Rollout, now

log = logging.getLogger("harnessrl.gateway")

__all__ = ["native_messages", "native_responses"]

#: JSON that may escape a lone surrogate (a pair matches too: only the parse tells them apart).
ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
ESCAPED_SURROGATE_BYTES = re.compile(ESCAPED_SURROGATE.pattern.encode())


def surrogates_replaced(parsed: Any) -> Any | None:
    """``parsed`` (an upstream's JSON) with each lone UTF-16 surrogate as U+FFFD
    (``reading.without_surrogates``), or ``None`` where it has none. Passed on as sent, the
    surrogate was recorded and ``harnessrl sft`` stopped on it with a ``TypeError`` (the student's
    tokenizer cannot encode it), and the harness's next call, resending it, was refused (400): the
    harness gets and the record keeps U+FFFD instead, as on the translated paths."""
    clean = without_surrogates(parsed)
    return None if clean == parsed else clean


async def native_messages(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/messages`` forwarded to the upstream's ``/messages``."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = parse_body(await read_body(request, state.config.max_body_bytes))
    validate_body(MessagesRequest, data)  # a request invalid in the harness's API never goes out
    # A trailing assistant message is a prefill Anthropic would continue: the recorded "answer" would
    # be the rest of that turn, recorded as a new one. Refused as the policy path refuses it.
    refuse_prefill(data["messages"])
    rollout = await open_rollout(state, rollout)
    body = teacher_sampling(
        {**data, "model": teacher.model}, rollout, state.config.max_tokens, ("max_tokens",)
    )
    body = thinking_within_cap(body, data.get("max_tokens"))
    headers = {"anthropic-version": request.headers.get("anthropic-version") or ANTHROPIC_VERSION}
    if request.headers.get("anthropic-beta"):
        headers["anthropic-beta"] = request.headers["anthropic-beta"]
    upstream = teacher.anthropic_request("/messages", body, headers)
    return await _forward(
        request, state, rollout, teacher, upstream, "messages", data, bool(data.get("stream"))
    )


async def native_responses(request: Request, teacher: Teacher) -> Response:
    """``POST /v1/responses`` forwarded to the upstream's ``/responses``."""
    state: GatewayState = request.app.state.gateway
    rollout = await authorize_rollout(request, state, request.path_params.get("rollout_id"))
    data = parse_body(await read_body(request, state.config.max_body_bytes))
    parsed = validate_body(ResponsesRequest, data)
    if PREVIOUS_KEY in data:
        raise BadRequest(f"{PREVIOUS_KEY} is reserved", param=PREVIOUS_KEY)
    recorded = data
    if (
        parsed.previous_response_id
    ):  # the upstream's id, recorded with its answer: resolved as the policy path does
        previous = await resolve_previous(state, rollout, parsed.previous_response_id)
        recorded = {**data, PREVIOUS_KEY: previous}
    rollout = await open_rollout(state, rollout)
    body = teacher_sampling(
        {**data, "model": teacher.model}, rollout, state.config.max_tokens, ("max_output_tokens",)
    )
    upstream = teacher._client.build_request("POST", "/responses", json=body)
    return await _forward(
        request, state, rollout, teacher, upstream, "responses", recorded, bool(parsed.stream)
    )


async def _forward(
    request: Request,
    state: GatewayState,
    rollout: Rollout,
    teacher: Teacher,
    upstream: httpx.Request,
    api: str,
    recorded: dict[str, Any],
    stream: bool,
) -> Response:
    started_at = now()

    async def fetch() -> tuple[httpx.Response, bytes | None]:
        """The upstream's reply, with its whole body unless it is a stream that began."""
        try:
            reply = await teacher._client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
        if stream and reply.status_code == 200:
            return reply, None
        try:
            return reply, await read_bounded(reply, state.config.max_body_bytes)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"teacher upstream failed: {type(exc).__name__}") from None
        finally:
            await reply.aclose()

    fetched = await unless_client_leaves(request, state, rollout, api, fetch)
    if fetched is None:
        return Response(status_code=CLIENT_GONE_STATUS)
    reply, content = fetched
    if content is not None:
        if reply.status_code != 200:
            raise upstream_error(teacher, reply.status_code, content)
        try:
            answer = json.loads(content)
            if ESCAPED_SURROGATE_BYTES.search(content) and (clean := surrogates_replaced(answer)) is not None:
                answer, content = clean, json.dumps(clean, ensure_ascii=False).encode()
            message, finish, usage = (messages_answer if api == "messages" else responses_answer)(answer)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, HarnessRLError):
            raise UpstreamError(f"teacher upstream answered 200 without a {api} answer") from None
        stored = await record(state, rollout, api, recorded, message, finish, usage, started_at, None)
        return Response(content, media_type="application/json", headers=call_headers(stored))
    relay = _relay_messages if api == "messages" else _relay_responses
    return StreamingResponse(
        relay(state, rollout, teacher, reply, recorded, started_at),
        media_type="text/event-stream",
        headers={**SSE_HEADERS, "x-harnessrl-rollout-id": rollout.rollout_id},
    )


async def _events(
    state: GatewayState, teacher: Teacher, reply: httpx.Response
) -> AsyncIterator[tuple[list[str], dict[str, Any]]]:
    """The upstream's SSE events: (their lines as sent, the parsed ``data``)."""
    lines: list[str] = []
    last_event = time.monotonic()  # the last that was not a keep-alive
    try:
        async for line in bounded_lines(reply, state.config.max_body_bytes):
            if line:
                lines.append(line)
                continue
            data = next((x[5:].strip() for x in lines if x.startswith("data:")), None)
            if data is not None:
                try:
                    parsed = json.loads(data)
                    clean = surrogates_replaced(parsed) if ESCAPED_SURROGATE.search(data) else None
                except (ValueError, RecursionError):
                    raise UpstreamError("teacher upstream sent an event that is not JSON") from None
                if clean is not None:
                    parsed = clean  # and the harness gets the event as it is recorded:
                    at = next(i for i, x in enumerate(lines) if x.startswith("data:"))
                    lines[at] = f"data: {json.dumps(clean, ensure_ascii=False)}"
                event = parsed if isinstance(parsed, dict) else {}
                if event.get("type") == "ping":
                    teacher.quiet_for(last_event)
                else:
                    last_event = time.monotonic()
                yield lines, event
            else:
                teacher.quiet_for(last_event)  # comments only
            lines = []
    except httpx.HTTPError as exc:
        raise UpstreamError(f"teacher upstream stream broke: {type(exc).__name__}") from None


def _sent(lines: list[str]) -> str:
    return "\n".join(lines) + "\n\n"


async def _relay_messages(
    state: GatewayState,
    rollout: Rollout,
    teacher: Teacher,
    reply: httpx.Response,
    recorded: dict[str, Any],
    started_at: float,
) -> AsyncIterator[str]:
    """The upstream's events as they come; ``message_stop`` only after the call is recorded."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}  # a tool_use block's input JSON, as it streams
    answer: dict[str, Any] = {}
    first_token_at: float | None = None
    try:
        async for lines, event in _events(state, teacher, reply):
            kind = event.get("type")
            if kind == "error":
                said = teacher.redact(str((event.get("error") or {}).get("message", "error")))
                raise UpstreamError(f"teacher upstream: {said}")
            if kind == "message_start":
                answer = dict(event.get("message") or {})
            elif kind == "content_block_start":
                blocks[event["index"]] = dict(event["content_block"])
            elif kind == "content_block_delta":
                first_token_at = first_token_at or now()
                block, delta = blocks[event["index"]], event["delta"]
                for field in ("text", "thinking", "signature"):
                    if f"{field}_delta" == delta.get("type"):
                        block[field] = (block.get(field) or "") + delta[field]
                if delta.get("type") == "input_json_delta":
                    partial.setdefault(event["index"], []).append(delta.get("partial_json") or "")
            elif kind == "message_delta":
                answer.update(event.get("delta") or {})
                answer["usage"] = {**(answer.get("usage") or {}), **(event.get("usage") or {})}
            elif kind == "message_stop":
                for index, pieces in partial.items():
                    # A surrogate escaped inside the partial JSON's text passed the event's check.
                    blocks[index]["input"] = without_surrogates(json.loads("".join(pieces) or "{}"))
                answer["content"] = [blocks[i] for i in sorted(blocks)]
                message, finish, usage = messages_answer(answer)
                await record(
                    state, rollout, "messages", recorded, message, finish, usage, started_at, first_token_at
                )
                yield _sent(lines)
                return
            yield _sent(lines)
        raise UpstreamError("teacher upstream ended the stream before finishing the answer")
    except HarnessRLError as exc:
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield anthropic_sse_error(exc)
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError):
        exc = UpstreamError("teacher upstream sent events that do not make a message")
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, exc)
        yield anthropic_sse_error(exc)
    finally:
        await reply.aclose()


async def _relay_responses(
    state: GatewayState,
    rollout: Rollout,
    teacher: Teacher,
    reply: httpx.Response,
    recorded: dict[str, Any],
    started_at: float,
) -> AsyncIterator[str]:
    """The upstream's events as they come; ``response.completed`` (or ``.incomplete``) only after
    the call is recorded, from the Response object that event carries."""
    first_token_at: float | None = None
    last: dict[str, Any] = {}
    try:
        async for lines, event in _events(state, teacher, reply):
            kind = event.get("type") or ""
            if isinstance(event.get("response"), dict):
                last = event["response"]
            if kind in ("error", "response.failed"):
                error = event.get("error") or last.get("error") or {}
                said = teacher.redact(
                    str(error.get("message", "error") if isinstance(error, dict) else error)
                )
                raise UpstreamError(f"teacher upstream: {said}")
            if kind.endswith(".delta"):
                first_token_at = first_token_at or now()
            if kind in ("response.completed", "response.incomplete"):
                message, finish, usage = responses_answer(event["response"])
                await record(
                    state, rollout, "responses", recorded, message, finish, usage, started_at, first_token_at
                )
                yield _sent(lines)
                return
            yield _sent(lines)
        raise UpstreamError("teacher upstream ended the stream before finishing the answer")
    except (HarnessRLError, KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        error = (
            exc
            if isinstance(exc, HarnessRLError)
            else UpstreamError("teacher upstream sent events that do not make a response")
        )
        log.warning("teacher call of rollout %s not recorded: %s", rollout.rollout_id, error)
        failed = {
            **last,
            "status": "failed",
            "error": {"code": error_shape(error).code, "message": str(error)},
        }
        yield sse_event({"type": "response.failed", "response": failed})
    finally:
        await reply.aclose()
