"""An SGLang server as an Engine, through its native ``/generate`` API (token IDs in and out).

Request (docs.sglang.io "Sampling Parameters" / "Native APIs"; ``GenerateReqInput`` in
``sglang/srt/managers/io_struct.py``)::

    {"input_ids": [...], "stream": true, "return_logprob": true,
     "sampling_params": {"max_new_tokens", "temperature", "top_p", "stop_token_ids",
                         "skip_special_tokens": false, "no_stop_trim": true}}

``no_stop_trim`` keeps a sampled stop token in the output, as our protocol wants; ``ignore_eos``
leaves the stopping to the request's ``stop_token_ids`` (the gateway's), as with vLLM. Each stream
event is ``data: {"text", "output_ids", "meta_info": {"output_token_logprobs": [[logprob, token_id,
text], ...], "finish_reason", ...}}``, ending with ``data: [DONE]``. By default SGLang streams *cumulative*
``output_token_logprobs`` (every event repeats the tokens so far); with the server flag
``--incremental-streaming-output`` each event has only new ones. Both are handled: we count what was
yielded and take the new suffix (``incremental_stream=True`` reads each event as new tokens only).

Finish reasons. ``meta_info.finish_reason`` is null until the last event, then SGLang's
``to_json()`` of how it ended: ``{"type": "stop", "matched": ...}``, ``{"type": "length", "length":
N}`` or ``{"type": "abort", "message": ...}`` (``/pause_generation`` with ``mode: abort``, which
``_install_weights`` uses, ends every running request that way). An abort raises a retryable
:class:`AbortedByEngine`, like vLLM's: the answer is not the policy's. An answer without a stop token
must end with ``length``; ending with no finish reason before its budget, or with ``stop`` and no stop
token, is a retryable :class:`MalformedAnswer`. So are a sampled token's logprob that is null, not finite or
above 0, an ID that is not an integer below the vocabulary size, and more tokens than
``max_new_tokens`` (:mod:`harnessrl.engines.sample_checks`).

Model and context length: ``GET /get_model_info`` (``model_path``) and ``GET /get_server_info``
(``context_length``; ``null`` means the model's own, then the tokenizer's config is used).

Weight updates (docs.sglang.io "SGLang for RL Systems"): ``POST /pause_generation``, then
``POST /update_weights_from_disk`` ``{"model_path": dir}`` (answers ``{"success", "message"}``; it
flushes the radix cache itself), then ``POST /continue_generation``. LoRA (``[trainer.lora]``,
server started with ``--enable-lora``): each step's adapter is ``POST /load_lora_adapter
{"lora_name": "harnessrl-lora-v<N>", "lora_path": FOLDER}``, calls name it in ``"lora_path"`` (SGLang
takes an adapter's name there), and the previous one is ``POST /unload_lora_adapter``. Exercised only
against ``tests/fakes/sglang_server.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import orjson

from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, cut_at_stop
from harnessrl.engines.remote import (
    AbortedByEngine,
    MalformedAnswer,
    RemoteEngine,
    RemoteEngineError,
    stream_error,
)
from harnessrl.engines.sample_checks import check_count, check_token_ids, checked_logprobs, token_id_limit
from harnessrl.engines.vllm import DISCOVERY_TIMEOUT_S
from harnessrl.token_ids import json_array


class SGLangEngine(RemoteEngine):
    """One SGLang server. Implements :class:`harnessrl.engines.base.Engine`."""

    kind = "sglang"

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        incremental_stream: bool = False,
        pause_for_update: bool = True,
        request_seeds: Literal["drop", "pass"] = "drop",
        **kwargs: Any,
    ):
        super().__init__(base_url, tokenizer, **kwargs)
        self.incremental_stream = incremental_stream
        self.pause_for_update = pause_for_update
        self.request_seeds = request_seeds  # as vLLM's: a fixed harness seed would repeat a group's answer
        self._token_id_limit = token_id_limit(tokenizer)  # sampled IDs are below this
        self._discovered = False  # ``start`` read the served model and context

    async def start(self) -> None:
        await super().start()
        self._discovered = True

    async def _discover(self) -> tuple[str | None, int | None]:
        info = await self.http.request_json("GET", "/get_model_info", timeout_s=DISCOVERY_TIMEOUT_S)
        model = info.get("model_path") if isinstance(info, dict) else None
        try:
            server = await self.http.request_json("GET", "/get_server_info", timeout_s=DISCOVERY_TIMEOUT_S)
        except RemoteEngineError as exc:
            if exc.retryable:
                raise
            server = {}  # older servers: fall back to the tokenizer's max_position_embeddings
        context = server.get("context_length") if isinstance(server, dict) else None
        return model, context

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        if not self._discovered:  # down when its pool started (as vLLM's: ``VLLMEngine._not_discovered``)
            raise RemoteEngineError(
                f"SGLang at {self.base_url} has not been discovered yet (it was down when the engine "
                "started); it takes calls once a health check finds it up",
                retryable=True,
                url=self.base_url,
            )
        budget = self._check_prompt(prompt_ids, params.max_tokens)
        sampling: dict[str, Any] = {
            "max_new_tokens": budget,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "skip_special_tokens": False,
            "no_stop_trim": True,
            # Only the gateway's stop tokens end an answer (as with vLLM): the model's own EOS would end
            # it with "stop" and no stop token of the request's, which reads as a cut-short answer.
            "ignore_eos": True,
        }
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None and self.request_seeds == "pass":
            sampling["sampling_seed"] = params.seed
        body = {
            "input_ids": orjson.Fragment(json_array(prompt_ids)),  # kept by a gateway's TokenIds
            "sampling_params": sampling,
            "return_logprob": True,
            "stream": True,
        }
        if self._adapter is not None:  # LoRA: the adapter of the call's version, by its name
            body["lora_path"] = self._adapter
        url = f"{self.base_url}/generate"
        stops = set(params.stop_token_ids)
        yielded = 0
        finish: str | None = None
        interval_s = context.stream_interval_s if context is not None else 0.0
        try:
            async with self.http.stream_sse("/generate", body, interval_s=interval_s) as batches:
                async for events in batches:
                    for event in events:
                        error = stream_error(event, url)
                        if error is not None:
                            raise error
                        meta = event.get("meta_info") if type(event) is dict else None
                        if type(meta) is not dict:
                            raise MalformedAnswer(f"event without meta_info: {str(event)[:120]!r}", url=url)
                        entries = meta.get("output_token_logprobs") or []
                        if type(entries) is not list:
                            raise MalformedAnswer(f"output_token_logprobs is {str(entries)[:60]!r}", url=url)
                        new = entries if self.incremental_stream else entries[yielded:]
                        if finish is not None and new:
                            raise MalformedAnswer(f"tokens after finish_reason {finish!r}", url=url)
                        finish = _finish_reason(meta.get("finish_reason"), url) or finish
                        ids, logprobs = self._samples(new, url)
                        ids, logprobs, stopped = cut_at_stop(ids, logprobs, stops)
                        yielded += len(ids)
                        check_count(yielded, budget, url)
                        if ids:
                            yield Samples(ids, logprobs)
                        if stopped:
                            return
        except RemoteEngineError as exc:
            # The answer was whole before this (the server said ``length`` with its last tokens, or
            # the whole budget came): the server failing while the rest of the stream is read (gone
            # before ``[DONE]``, a garbled or error event) must not fail the call, which a pool would
            # continue past the answer's end.
            if not ((finish == "length" or yielded >= budget) and type(exc) is RemoteEngineError):
                raise
        # The stream ended without a stop token: SGLang must have said it ran out of budget (or not
        # said, with the whole budget sent).
        if finish != "length" and not (finish is None and yielded >= budget):
            said = "no finish_reason" if finish is None else f"finish_reason {finish!r} but no stop token"
            raise MalformedAnswer(f"the answer ended after {yielded} tokens with {said}", url=url)

    def _samples(self, entries: list[Any], url: str) -> tuple[list[int], list[float]]:
        """The IDs and logprobs of ``output_token_logprobs`` entries, ``[logprob, token_id, text]``."""
        try:
            logprobs = [entry[0] for entry in entries]
            ids = [entry[1] for entry in entries]
        except (TypeError, IndexError, KeyError):
            bad = next((e for e in entries if not (type(e) in (list, tuple) and len(e) >= 2)), entries)
            raise MalformedAnswer(f"bad output_token_logprobs entry {str(bad)[:80]}", url=url) from None
        check_token_ids(ids, self._token_id_limit, url)
        return ids, checked_logprobs(logprobs, url)

    async def _install_weights(self, checkpoint_dir: str, version: int) -> None:
        if self.pause_for_update:
            await self.http.request_json("POST", "/pause_generation", json_body={"mode": "abort"})
        try:
            answer = await self.http.request_json(
                "POST", "/update_weights_from_disk", json_body={"model_path": checkpoint_dir}
            )
            if isinstance(answer, dict) and answer.get("success") is False:
                raise RemoteEngineError(
                    f"{self.base_url}/update_weights_from_disk failed: {answer.get('message')}",
                    retryable=False,
                )
        finally:
            if self.pause_for_update:
                await self.http.request_json("POST", "/continue_generation", json_body={})

    async def _load_adapter(self, name: str, folder: str) -> None:
        answer = await self.http.request_json(
            "POST", "/load_lora_adapter", json_body={"lora_name": name, "lora_path": folder}
        )
        if isinstance(answer, dict) and answer.get("success") is False:
            raise RemoteEngineError(
                f"{self.base_url}/load_lora_adapter failed: {answer.get('message')}",
                retryable=False,
                status=400,
            )

    async def _unload_adapter(self, name: str) -> None:
        await self.http.request_json("POST", "/unload_lora_adapter", json_body={"lora_name": name})

    async def health(self) -> dict[str, Any]:
        await self.http.request_json("GET", "/health", timeout_s=5.0)
        if not self._discovered:  # down when the pool started: discovered before it serves
            await self.start()
        return {
            "engine": "sglang",
            "url": self.base_url,
            "model": self.model_name,
            "policy_version": self._version,
        }


def _finish_reason(finish: Any, url: str) -> str | None:
    """The ``type`` of SGLang's ``meta_info.finish_reason`` (``stop`` or ``length``; None until the
    last event); :class:`AbortedByEngine` for an abort, :class:`MalformedAnswer` for anything else."""
    if finish is None:
        return None
    kind = finish.get("type") if type(finish) is dict else finish
    if kind in ("stop", "length"):
        return kind
    if kind == "abort":
        message = finish.get("message") if type(finish) is dict else None
        raise AbortedByEngine(
            f"{url}: the server aborted the generation ({message or 'paused with mode=abort'}); the "
            "partial answer is discarded",
            url=url,
        )
    raise MalformedAnswer(f"unknown finish_reason {str(finish)[:80]!r}", url=url)
