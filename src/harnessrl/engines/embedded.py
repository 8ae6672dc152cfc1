"""The embedded engine: a transformers causal LM in-process, with continuous batching.

One background thread owns the model. Each iteration of its loop it

1. admits waiting requests into free rows and prefills them (chunked: at most ``prefill_chunk``
   prompt tokens per iteration, so one long prompt does not stall everyone else's decoding);
2. runs one decode step for every decoding row together (:class:`BatchedDecoder`);
3. samples (:func:`sample_tokens`) and hands each request its token through its own event loop
   (one ``call_soon_threadsafe`` per loop per step), then retires finished or cancelled rows.

Shared prompt prefixes are computed once. An RL step sends the same prompt ``group_size`` times and
every prompt of a harness starts with the same system prompt and tool schemas, so before prefilling
a request the engine copies the longest prompt prefix it shares with a decoding row from that row's
KV cache and prefills only the rest. A request whose best match is a prompt being prefilled in the
same iteration waits one iteration for it (``prefix_sharing=False`` turns all of this off).

Logprobs are those of the distribution sampled from (see :mod:`harnessrl.engines.sampling`:
``log_softmax(logits / T)``, renormalized over the nucleus when ``top_p < 1``; greedy reports
temperature 1).

Weight updates take the step lock, so they land between two decode steps; tensors are copied in
place (``load_state_dict`` into the transformers module, whose projection weights are views into the
decoder's fused tensors). While the trainer in the same process steps, ``release_weights`` frees
the engine's copy (each weight storage resized to nothing in place, so every view, fused or not,
stays valid) and the next full update refills it: on CPU that copy is 0.54 GB of SmolLM2 in float32
at the moment the trainer's memory peaks. torch is imported only by this module and :mod:`.decoder`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, WeightUpdate
from harnessrl.engines.decoder import BatchedDecoder
from harnessrl.engines.sampling import sample_tokens
from harnessrl.errors import (
    ConfigError,
    ContextLengthExceeded,
    InvalidGenerationRequest,
    InvalidWeightUpdate,
    UpstreamError,
)
from harnessrl.hardware import resolve_dtype
from harnessrl.token_ids import common_prefix
from harnessrl.tokenizer import PolicyTokenizer

_DONE = object()  # end-of-stream marker put on a request's queue
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    rng: random.Random
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Any]
    stops: frozenset[int]
    cancelled: bool = False  # set by the consumer's thread; read by the engine thread
    waiting: bool = True  # in ``_pending`` (both guarded by ``_wake``)
    prefilled: int = 0  # prompt tokens already in the cache
    position: int = 0  # tokens in the cache (prompt + generated, minus the pending one)
    generated: int = 0
    last_token: int = -1  # sampled but not yet fed back
    submitted_at: float = field(default_factory=time.monotonic)


class EmbeddedEngine:
    """Serves a local Hugging Face model folder; implements :class:`harnessrl.engines.base.Engine`."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        context_length: int | None = None,
        seed: int = 0,
        prefill_chunk: int = 512,
        num_threads: int | None = None,
        prefix_sharing: bool = True,
        request_seeds: Literal["drop", "pass"] = "pass",
    ):
        dtype = resolve_dtype(dtype, device)
        if dtype not in _DTYPES:
            raise ConfigError(f"engine.dtype must be one of {sorted([*_DTYPES, 'auto'])}, got {dtype!r}")
        self._model_dir = Path(model_dir)
        self._model_name = model_name or self._model_dir.name
        self._device = torch.device(device)
        self._dtype = _DTYPES[dtype]
        self._max_batch = max_batch_size
        self._prefill_chunk = prefill_chunk
        self._num_threads = num_threads
        self._prefix_sharing = prefix_sharing
        self._tokenizer = PolicyTokenizer.from_dir(self._model_dir)
        model_ctx = self._tokenizer.max_position_embeddings or 4096
        self._context_length = min(context_length or model_ctx, model_ctx)
        self._seed_rng = random.Random(seed)
        self._seed = seed
        # "drop": a request's seed is ignored (``[engine] request_seeds``, "drop" in a config): a
        # harness that sends one fixed seed would otherwise get one answer for a whole group.
        self._request_seeds = request_seeds
        self._version = 0
        self._model: Any = None
        self._decoder: BatchedDecoder | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._abandoned = 0  # about how many of ``_pending`` their callers cancelled (``_drop_abandoned``)
        self._rows: list[_Request] = []  # decoding requests; index = cache row
        self._prefilling: _Request | None = None  # at most one partly prefilled request...
        self._prefill_row = 0  # ...whose cache is in this row (>= len(_rows))
        self._wake = threading.Condition()
        self._step_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        # Set (under ``_wake``) when the engine thread has ended, so ``generate`` never queues a
        # request that no thread will serve: it raises this instead.
        self._ended: UpstreamError | None = None
        # Every weight's memory, each storage once with its size (``release_weights``).
        self._weight_storages: list[tuple[torch.UntypedStorage, int]] = []
        self._released = False
        self._stats = {"steps": 0, "tokens": 0, "requests": 0, "prefill_tokens": 0, "prefix_reused_tokens": 0}

    # --- Engine properties ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def tokenizer(self) -> PolicyTokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def shares_weights(self) -> bool:
        return False  # this process holds the weights; update_weights is the only way to change them

    def adopt_policy_version(self, version: int) -> None:
        raise ConfigError("the embedded engine holds its own weights: update them with update_weights")

    @property
    def model(self) -> Any:
        """The transformers module (its parameters are the ones served)."""
        return self._model

    # --- lifecycle -----------------------------------------------------------------------------------

    def _load(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        if self._num_threads:
            torch.set_num_threads(self._num_threads)
        # Seeded for its own load only: an engine in the trainer's process must leave torch's generators
        # as they were (a resumed run has just restored the state that draws its dropout masks). The
        # seed reaches every GPU's generator, so each in use is put back (none on a CPU-only process).
        on_gpu = self._device.type == "cuda" or torch.cuda.is_initialized()
        forked = list(range(torch.cuda.device_count())) if on_gpu else []
        with torch.random.fork_rng(devices=forked):
            torch.manual_seed(self._seed)
            model = AutoModelForCausalLM.from_pretrained(str(self._model_dir), dtype=self._dtype)
        model.to(self._device).eval().requires_grad_(False)
        try:
            decoder = BatchedDecoder(model, max_rows=self._max_batch, context_length=self._context_length)
        except NotImplementedError as exc:
            raise ConfigError(f"the embedded engine cannot serve {str(self._model_dir)!r}: {exc}") from exc
        self._model, self._decoder = model, decoder
        self._weight_storages = _own_weight_storages(model)

    async def start(self) -> None:
        if self._thread is not None:
            return
        await asyncio.to_thread(self._load)
        self._stopping = False
        self._ended = None
        self._thread = threading.Thread(target=self._run, name="harnessrl-engine", daemon=True)
        self._thread.start()

    async def aclose(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    # --- the public generate -------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        if self._thread is None or self._decoder is None:
            raise UpstreamError("the embedded engine is not started")
        if self._failure is not None:
            raise UpstreamError(f"the embedded engine failed: {self._failure!r}")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise InvalidGenerationRequest("the prompt is empty")
        if len(prompt) >= self._context_length:
            raise ContextLengthExceeded(
                f"prompt has {len(prompt)} tokens; the context length is {self._context_length}",
                param="messages",
            )
        vocab = self._decoder.embed.shape[0]
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise InvalidGenerationRequest(f"prompt token IDs must be in [0, {vocab})")
        if params.max_tokens < 1:
            raise InvalidGenerationRequest("max_tokens must be at least 1")
        passed = params.seed if self._request_seeds == "pass" else None
        seed = passed if passed is not None else self._seed_rng.getrandbits(64)
        request = _Request(
            prompt=prompt,
            params=params,
            rng=random.Random(seed),
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            stops=frozenset(params.stop_token_ids),
        )
        with self._wake:
            if self._ended is not None:  # the thread ended after the checks above: nobody would serve it
                raise UpstreamError(str(self._ended))
            if self._released:
                raise UpstreamError("the embedded engine's weights are released until the next weight update")
            self._pending.append(request)
            self._wake.notify()
        finished = False
        try:
            while True:
                item = await request.queue.get()
                if item is _DONE:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:  # the consumer closed the iterator or was cancelled: free the row
                with self._wake:
                    request.cancelled = True
                    if request.waiting:
                        self._drop_abandoned()
                    self._wake.notify()

    def _drop_abandoned(self) -> None:
        """(Under ``_wake``.) A waiting request was cancelled. Once such requests are half of the
        queue, they are dropped from it: while every row is busy, a harness that sends requests and
        hangs up would otherwise grow the queue (their prompts) without bound. Each drop takes the
        queue's length in time, after as many cancellations: O(1) per cancellation."""
        self._abandoned += 1
        if 2 * self._abandoned > len(self._pending):
            kept = [r for r in self._pending if not r.cancelled]
            self._pending.clear()
            self._pending.extend(kept)
            self._abandoned = 0

    # --- weights and health --------------------------------------------------------------------------

    def _load_state_dict(self, update: WeightUpdate) -> None:
        state = update.state_dict
        if state is None and update.checkpoint_dir is not None:
            from safetensors.torch import load_file

            state = {}
            for path in sorted(Path(update.checkpoint_dir).glob("*.safetensors")):
                state.update(load_file(str(path)))
        if state is None:
            raise InvalidWeightUpdate("a weight update needs a state_dict or a checkpoint_dir")
        if not state:  # it would only relabel the weights served with the new version
            where = (
                f"checkpoint_dir {update.checkpoint_dir!r} (no *.safetensors)"
                if update.state_dict is None
                else "state_dict"
            )
            raise InvalidWeightUpdate(f"weight update {update.version} holds no weights: an empty {where}")
        # Checked before any weight is copied: ``load_state_dict`` copies every weight it can before it
        # reports the others, so an update refused after it would leave the engine serving some of
        # the new weights under the old version.
        own = self._model.state_dict()
        unexpected = [name for name in state if name not in own]
        if unexpected:
            raise InvalidWeightUpdate(f"unexpected weights in update: {unexpected[:5]}")
        misshapen = [
            f"{name} {tuple(getattr(value, 'shape', ()))} (the model's: {tuple(own[name].shape)})"
            for name, value in state.items()
            if tuple(getattr(value, "shape", ())) != tuple(own[name].shape)
        ]
        if misshapen:
            raise InvalidWeightUpdate(f"weights of the wrong shape in update: {misshapen[:3]}")
        # ``load_state_dict`` copies every tensor it can before it reports one it cannot copy (a numpy
        # array, a tensor without data): the engine served some new weights under the old version.
        uncopyable = [
            f"{name} ({type(value).__name__})"
            for name, value in state.items()
            if not isinstance(value, torch.Tensor) or value.is_meta
        ]
        if uncopyable:
            raise InvalidWeightUpdate(
                f"weights in update that are not torch tensors with data: {uncopyable[:3]}"
            )
        with self._step_lock, torch.no_grad():
            if self._released:
                self._refill(state)
            # strict=False: tied weights may be present under one name only.
            self._model.load_state_dict(state, strict=False)
            self._version = update.version

    async def update_weights(self, update: WeightUpdate) -> None:
        await asyncio.to_thread(self._load_state_dict, update)

    async def release_weights(self) -> bool:
        return await asyncio.to_thread(self._release_weights)

    def _release_weights(self) -> bool:
        with self._step_lock:  # between two engine steps; the engine thread takes the wake lock after it
            with self._wake:  # no generate() gets in after this: it raises while released
                idle = not (self._pending or self._rows or self._prefilling is not None)
                if not idle or not self._weight_storages or self._released:
                    return False
                self._released = True
            assert self._decoder is not None
            self._decoder.release()  # the KV cache too (the idle engine thread does the same)
            for storage, _ in self._weight_storages:
                storage.resize_(0)
        return True

    def _refill(self, state: dict[str, torch.Tensor]) -> None:
        """Give the released weights their memory back, for ``state`` to overwrite every byte of it:
        an update that leaves a weight out would leave it uninitialized (InvalidWeightUpdate)."""
        covered = {id(p) for name, p in self._model.named_parameters(remove_duplicate=False) if name in state}
        missing = [name for name, p in self._model.named_parameters() if id(p) not in covered]
        if missing:
            raise InvalidWeightUpdate(
                f"the engine's weights are released and this update leaves out {len(missing)} of them "
                f"({', '.join(missing[:3])}): an update after release_weights must hold every weight"
            )
        for storage, size in self._weight_storages:
            storage.resize_(size)
        with self._wake:
            self._released = False

    async def health(self) -> dict[str, Any]:
        if self._failure is not None:
            raise UpstreamError(f"the embedded engine failed: {self._failure!r}")
        if self._thread is None or not self._thread.is_alive():
            raise UpstreamError("the embedded engine is not running")
        return {
            "engine": "embedded",
            "model": self._model_name,
            "policy_version": self._version,
            "device": str(self._device),
            "dtype": str(self._dtype).removeprefix("torch."),
            "active": len(self._rows) + (self._prefilling is not None),
            "weights_released": self._released,
            "waiting": len(self._pending),
            **self._stats,
        }

    # --- the engine thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._wake:
                        while not (self._stopping or self._pending or self._rows or self._prefilling):
                            self._decoder.release()  # idle: give the KV cache memory back
                            self._wake.wait()
                        if self._stopping:
                            break
                    with self._step_lock:
                        self._step()
        except BaseException as exc:  # noqa: BLE001 - every waiting caller must hear about it
            self._failure = exc
            error = UpstreamError(f"the embedded engine failed: {exc!r}")
            error.__cause__ = exc
            self._fail_all(error)
            return
        self._fail_all(UpstreamError("the embedded engine shut down"))

    def _fail_all(self, error: UpstreamError) -> None:
        """The engine thread ends: every request it holds gets ``error``, and so does every later
        ``generate`` (``_ended``, set under the lock that queues requests)."""
        with self._wake:
            self._ended = error
            waiting = list(self._pending) + self._rows + ([self._prefilling] if self._prefilling else [])
            self._pending.clear()
            self._abandoned = 0
        self._rows, self._prefilling = [], None
        for request in waiting:
            # A request whose event loop is closed has nobody listening; raising here would leave
            # every request after it waiting forever.
            with contextlib.suppress(RuntimeError):
                request.loop.call_soon_threadsafe(request.queue.put_nowait, error)

    def _step(self) -> None:
        """One iteration: admit/prefill within the chunk budget, one decode step, deliver, retire."""
        decoder = self._decoder
        assert decoder is not None
        out: list[tuple[_Request, Any]] = []  # (request, Samples | _DONE) to deliver
        # Choose this iteration's prefill segments: the partly prefilled request first, then waiting
        # ones, up to `prefill_chunk` prompt tokens. Segment j goes to row len(_rows) + j, so the
        # completed ones line up behind the decoding rows and a partial one (always last) follows.
        segments: list[tuple[_Request, list[int]]] = []
        budget = self._prefill_chunk
        request = self._prefilling
        if request is not None and request.cancelled:
            out.append((request, _DONE))
            self._prefilling = request = None
        if request is not None and self._prefill_row != len(self._rows):
            # Rows were retired since its last chunk: bring its partial cache down to its new row.
            decoder.move_row(self._prefill_row, len(self._rows), request.prefilled)
        self._prefilling = None
        first_row = len(self._rows)
        while budget > 0 and len(self._rows) + len(segments) < self._max_batch:
            if request is None:
                with self._wake:
                    if not self._pending:
                        break
                    request = self._pending.popleft()
                    request.waiting = False
                    if request.cancelled:
                        self._abandoned = max(0, self._abandoned - 1)
                if request.cancelled:
                    self._stats["requests"] += 1
                    out.append((request, _DONE))
                    request = None
                    continue
                if self._prefix_sharing and not self._share_prefix(
                    request, first_row + len(segments), [r for r, _ in segments]
                ):
                    with self._wake:  # wait for the prompt it shares most with to be cached
                        self._pending.appendleft(request)
                        request.waiting = True
                    break
                self._stats["requests"] += 1
            chunk = request.prompt[request.prefilled : request.prefilled + budget]
            segments.append((request, chunk))
            budget -= len(chunk)
            self._stats["prefill_tokens"] += len(chunk)
            request = None
        if segments:
            logits_S_V = decoder.prefill_packed(
                [(first_row + j, chunk, r.prefilled) for j, (r, chunk) in enumerate(segments)]
            )
            fresh, fresh_logits = [], []
            for j, (r, chunk) in enumerate(segments):
                r.prefilled += len(chunk)
                if r.prefilled < len(r.prompt):  # only the last segment can be partial
                    self._prefilling, self._prefill_row = r, first_row + j
                    continue
                r.position = len(r.prompt)
                self._rows.append(r)
                fresh.append(r)
                fresh_logits.append(logits_S_V[j])
            if fresh:
                self._sample(fresh, torch.stack(fresh_logits), out)
        self._retire(out)  # e.g. max_tokens=1, or a stop token sampled right after the prompt
        if self._rows:
            decode_rows = list(self._rows)
            ids_B = torch.tensor([r.last_token for r in decode_rows], dtype=torch.long, device=decoder.device)
            pos_B = torch.tensor([r.position for r in decode_rows], dtype=torch.long, device=decoder.device)
            logits_B_V = decoder.decode(ids_B, pos_B)
            for r in decode_rows:
                r.position += 1
            self._stats["steps"] += 1
            self._sample(decode_rows, logits_B_V, out)
            self._retire(out)
        self._deliver(out)

    def _share_prefix(self, request: _Request, row: int, batch: list[_Request]) -> bool:
        """Start ``request`` (bound for cache ``row``) from the longest prompt prefix a decoding row holds.

        Returns False when a prompt being prefilled in this iteration (``batch``) shares clearly more
        with it than any decoding row: the caller puts it back to wait one iteration for that cache.
        At least the prompt's last token is always prefilled, for the logits of the first sample.
        """
        prompt = request.prompt
        limit = len(prompt) - 1
        best, best_row = 0, -1
        for source_row, source in enumerate(self._rows):
            shared = common_prefix(prompt, source.prompt, limit)
            if shared > best:
                best, best_row = shared, source_row
        pending = max((common_prefix(prompt, r.prompt, limit) for r in batch), default=0)
        if pending >= best + _MIN_SHARED_PREFIX and batch:
            return False
        if best >= _MIN_SHARED_PREFIX:
            decoder = self._decoder
            assert decoder is not None
            decoder.ensure_capacity(row + 1, best)
            decoder.move_row(best_row, row, best)
            request.prefilled = best
            self._stats["prefix_reused_tokens"] += best
        return True

    def _sample(
        self, requests: list[_Request], logits_B_V: torch.Tensor, out: list[tuple[_Request, Any]]
    ) -> None:
        temps_B = torch.tensor([r.params.temperature for r in requests], dtype=torch.float32)
        top_ps_B = torch.tensor([r.params.top_p for r in requests], dtype=torch.float32)
        uniforms_B = torch.tensor([r.rng.random() for r in requests], dtype=torch.float32)
        tokens_B, logprobs_B = sample_tokens(logits_B_V, temps_B, top_ps_B, uniforms_B)
        for request, token, logprob in zip(requests, tokens_B.tolist(), logprobs_B.tolist(), strict=True):
            request.last_token = token
            request.generated += 1
            self._stats["tokens"] += 1
            out.append((request, Samples([token], [logprob])))  # one token per decode step

    def _is_finished(self, r: _Request) -> bool:
        return (
            r.cancelled
            or r.last_token in r.stops
            or r.generated >= r.params.max_tokens
            or r.position + 1 >= self._context_length  # no room to feed the last token back
        )

    def _retire(self, out: list[tuple[_Request, Any]]) -> None:
        """Remove finished rows, keeping rows 0..n-1 contiguous by moving the last row into each gap."""
        decoder = self._decoder
        assert decoder is not None
        for row in range(len(self._rows) - 1, -1, -1):
            request = self._rows[row]
            if not self._is_finished(request):
                continue
            if not request.cancelled:
                out.append((request, _DONE))
            last = len(self._rows) - 1
            if row != last:
                moved = self._rows[last]
                decoder.move_row(last, row, moved.position)
                self._rows[row] = moved
            self._rows.pop()

    def _deliver(self, out: list[tuple[_Request, Any]]) -> None:
        """Hand tokens to their callers: one thread-safe callback per event loop per step."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
        for request, item in out:
            if request.cancelled and item is not _DONE:
                continue
            by_loop.setdefault(request.loop, []).append((request.queue, item))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed; nobody is listening
                loop.call_soon_threadsafe(_put_all, items)


#: Shorter shared prefixes are prefilled again: copying a few positions saves less than it costs.
_MIN_SHARED_PREFIX = 16


def _put_all(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


def _own_weight_storages(model: torch.nn.Module) -> list[tuple[torch.UntypedStorage, int]]:
    """Each storage of ``model``'s parameters once, with its size in bytes. A parameter whose memory
    the engine cannot resize (a mapping of the checkpoint file) is copied into memory of its own
    first; the first weight update would have written it out of the file anyway."""
    storages: dict[int, tuple[torch.UntypedStorage, int]] = {}
    with torch.no_grad():
        for param in model.parameters():
            if not param.untyped_storage().resizable():
                param.data = param.data.clone()
            storage = param.untyped_storage()
            storages.setdefault(storage.data_ptr(), (storage, storage.nbytes()))
    return list(storages.values())
