"""Helpers for the real-vLLM tests: starting servers, loading weights into them, reference logprobs.

Kept apart from ``conftest.py`` (which holds the fixtures) so test modules import them by name.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harnessrl.config import EngineConfig
from harnessrl.engines.base import WeightUpdate
from harnessrl.engines.factory import create_engine
from harnessrl.engines.launch import EngineServer, VLLMLaunch, find_vllm_python, free_port
from harnessrl.errors import ConfigError
from harnessrl.schemas import Call

#: Logprobs of one token, vLLM vs a transformers forward pass (fp32 on CPU: ~1e-6 measured).
LOGPROB_ATOL = 1e-3


def vllm_python() -> str:
    """The Python that has vLLM; skips the test without one (fails it in CI: no skips there)."""
    try:
        return find_vllm_python()
    except ConfigError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs vLLM for tests/vllm: {exc}")
        pytest.skip(str(exc))


def start_vllm_server(
    model_dir: Path,
    log_path: Path,
    *,
    served_model_name: str = "tiny",
    max_model_len: int = 4096,
    extra_args: Sequence[str] = (),
    lora_rank: int | None = None,
) -> EngineServer:
    """Launch a vLLM server of ``model_dir`` on a free port; not ready yet (call ``wait_ready``).
    ``lora_rank``: it loads LoRA adapters up to that rank at runtime (``[trainer.lora]`` runs)."""
    launch = VLLMLaunch(
        model=str(model_dir),
        served_model_name=served_model_name,
        port=free_port(),
        max_model_len=max_model_len,
        kv_cache_gib=1,
        enforce_eager=True,  # no torch.compile: ~45 s to start instead of ~100 s
        lora_rank=lora_rank,
        extra_args=tuple(extra_args),
    )
    server = EngineServer(launch, log_path=log_path, python=vllm_python())
    server.start()
    return server


def install_weights(
    url: str, folder: Path, version: int, *, before: Callable[[], None] | None = None
) -> None:
    """What the trainer does for a remote engine: its own engine client loads ``folder`` into the
    server (vLLM ``/pause?mode=wait``, ``/collective_rpc reload_weights``, ``/resume``). ``before``
    runs once that client is ready, right before the update, so what it does (resume a frozen
    server) is at most one request ahead of the update."""

    async def run() -> None:
        engine = create_engine(EngineConfig(model=f"vllm:{url}", tokenizer="tiny", health_interval_s=0))
        await engine.start()
        try:
            if before is not None:
                before()
            await engine.update_weights(WeightUpdate(version=version, checkpoint_dir=str(folder)))
        finally:
            await engine.aclose()

    asyncio.run(run())


def perturbed_checkpoint(model_dir: Path, folder: Path, *, seed: int, scale: float = 0.05) -> Path:
    """``model_dir``'s weights plus Gaussian noise, written by ``TrainablePolicy.save_checkpoint``
    exactly as the trainer writes the folders it hands remote engines."""
    import torch

    from harnessrl.trainer.policy import TrainablePolicy

    policy = TrainablePolicy(model_dir, device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale)
    return policy.save_checkpoint(folder, with_optimizer=False)


class Reference:
    """A transformers forward pass of a model folder: the tempered logprobs vLLM should report."""

    def __init__(self, folder: Path):
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def logprobs(
        self, prompt_ids: Sequence[int], response_ids: Sequence[int], temperature: float = 1.0
    ) -> list[float]:
        """``log_softmax(logits / T)`` of each response token given everything before it."""
        torch = self._torch
        ids_T = torch.tensor([[*prompt_ids, *response_ids]])  # (1, T)
        with torch.no_grad():
            logits_T_V = self.model(ids_T).logits[0].float()  # (T, V)
        logprobs_T_V = torch.log_softmax(logits_T_V / temperature, dim=-1)
        start = len(prompt_ids) - 1  # the position that predicts the first response token
        rows_R_V = logprobs_T_V[start : start + len(response_ids)]  # (R, V)
        return rows_R_V.gather(1, torch.tensor(list(response_ids))[:, None])[:, 0].tolist()


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    assert len(a) == len(b), f"{len(a)} vs {len(b)} logprobs"
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def direct_completion(
    url: str, prompt_ids: Sequence[int], *, model: str = "tiny", **fields: Any
) -> dict[str, Any]:
    """One non-streamed ``/v1/completions`` answer straight from vLLM (not through the gateway)."""
    body = {
        "model": model,
        "prompt": list(prompt_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        **fields,
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return {
        "token_ids": choice["token_ids"],
        "logprobs": choice["logprobs"]["token_logprobs"],
        "finish_reason": choice["finish_reason"],
    }


def server_metrics(url: str) -> dict[str, float]:
    """vLLM's Prometheus series in one read, each name summed over its labelled series
    (``vllm:request_success_total`` has one per finish reason)."""
    totals: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name = series.split("{", 1)[0]
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def server_metric(url: str, name: str) -> float:
    """One of vLLM's Prometheus series (``vllm:num_requests_running``, ``vllm:generation_tokens_total``)."""
    metrics = server_metrics(url)
    assert name in metrics, f"{url}/metrics has no {name}"
    return metrics[name]


def requests_running(url: str) -> int:
    """Requests the server is generating right now."""
    return int(server_metric(url, "vllm:num_requests_running"))


def requests_finished(url: str) -> int:
    """Requests the server has ended so far, whatever the reason."""
    return int(server_metric(url, "vllm:request_success_total"))


def preemptions(url: str) -> int:
    """Requests the server has preempted so far (KV dropped, back to its waiting queue). Counted in
    the stats of the step after the preemption: a paused server's count is not up to date."""
    return int(server_metric(url, "vllm:num_preemptions_total"))


def pause_server(url: str, mode: str, *, clear_cache: bool = False) -> None:
    """``POST /pause?mode=...`` straight to vLLM (``keep``: requests stay where they are and nothing
    is sampled until ``/resume``; ``abort``: every request ends now).

    ``clear_cache`` is false unless asked for, unlike vLLM's own default: vLLM 0.32 clears the caches
    of a ``keep`` pause too, preempting every running request (its KV dropped, back to the waiting
    queue, to be recomputed). A later ``/pause?mode=wait`` does not wait for a request in that state,
    so a generation frozen that way could be finished by the weights of the next update: what failed
    a CI run (``test_keep_pause_clearing_the_cache_hides_generations_from_a_wait`` shows it)."""
    params = {"mode": mode, "clear_cache": str(clear_cache).lower()}
    httpx.post(f"{url}/pause", params=params, timeout=60).raise_for_status()


def resume_server(url: str) -> None:
    httpx.post(f"{url}/resume", timeout=60).raise_for_status()


def freeze_mid_generation(url: str, calls: int, finished_before: int, *, clear_cache: bool = False) -> int:
    """Freeze the server (``/pause?mode=keep``) as soon as every one of ``calls`` requests it was
    sent (``finished_before``: its finished count before they started) generates there or has
    ended; returns how many it holds unfinished, frozen mid-generation.

    Why a freeze: the tiny model samples hundreds of tokens a second here, and this process (the
    clients and the gateway, starved of CPU by vLLM's busy threads) lags seconds behind the server,
    so "still generating" seen from a client is a guess (calls ended before an abort or update
    reached them in fresh-clone CI runs). So the server's own counts decide, both before and after:
    the running gauge says which requests reached it (one still on its way would only be sampled
    after the freeze) and the finished counter which of them ended, including one the gauge still
    shows from the last step before the freeze. The frozen requests keep their KV unless
    ``clear_cache`` (see ``pause_server``), so they stay running requests, which
    ``/pause?mode=wait`` waits for. The caller resumes the server or aborts what it holds
    (``/pause?mode=abort``)."""

    def held_and_unfinished() -> tuple[int, int]:
        # One read, so the two counts are of the same moment.
        metrics = server_metrics(url)
        unfinished = calls - (int(metrics["vllm:request_success_total"]) - finished_before)
        return min(int(metrics["vllm:num_requests_running"]), unfinished), unfinished

    def all_held() -> bool:
        held, unfinished = held_and_unfinished()
        return held == unfinished

    wait_until(
        all_held,
        lambda: "{} calls to generate in vLLM ({} of {} unfinished do)".format(calls, *held_and_unfinished()),
    )
    pause_server(url, "keep", clear_cache=clear_cache)
    # The server's API process records the last outputs of the engine shortly after the pause
    # answers; a second is far more than it takes.
    time.sleep(1.0)
    return held_and_unfinished()[0]


def wait_until(
    condition: Callable[[], bool], what: str | Callable[[], str], timeout_s: float = 120.0
) -> None:
    """Poll ``condition`` (a state read: a count, a flag) until it holds; fail naming ``what`` (a
    callable is asked at that moment, so it can describe the state it found)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f} s waiting for {what() if callable(what) else what}"
            )
        time.sleep(0.05)


def all_admitted(gateway: Any, threads: Sequence[threading.Thread]) -> bool:
    """Every call of ``threads`` is in flight at the gateway (past its gate, generating) or over."""
    ended = sum(not thread.is_alive() for thread in threads)
    return gateway.client.state()["in_flight"] + ended >= len(threads)


# -- clients in threads: long calls that something happens to while they run -------------------------

LONG_STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]


@dataclass
class Outcome:
    """What one client saw."""

    finish: str | None = None
    completion_tokens: int | None = None
    chunks: int = 0
    error: Exception | None = None
    message: dict[str, Any] | None = None  # the answer as a client appends it to its history

    def streaming(self, chunks: int = 5) -> bool:
        """A streamed answer is flowing (``chunks`` received) or already over."""
        return self.chunks >= chunks or self.finish is not None or self.error is not None

    def whole(self, max_tokens: int) -> bool:
        """A whole answer: no error, and ended by the policy or after its whole budget."""
        return (
            self.error is None
            and self.finish in ("stop", "length")
            and (self.finish == "stop" or self.completion_tokens == max_tokens)
        )


def chat_call(
    client: Any,
    outcome: Outcome,
    *,
    stream: bool,
    max_tokens: int,
    messages: list[dict[str, Any]],
    temperature: float = 1.0,
) -> None:
    """One chat call with the openai SDK, its result written into ``outcome`` (errors included)."""
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
    }
    try:
        if stream:
            events = client.chat.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True}
            )
            content = []
            for chunk in events:
                if chunk.usage is not None:
                    outcome.completion_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    outcome.chunks += 1
                    content.append(choice.delta.content or "")
                    outcome.finish = choice.finish_reason or outcome.finish
            outcome.message = {"role": "assistant", "content": "".join(content)}
        else:
            resp = client.chat.completions.create(**kwargs)
            outcome.finish = resp.choices[0].finish_reason
            outcome.completion_tokens = resp.usage.completion_tokens
            outcome.message = {"role": "assistant", "content": resp.choices[0].message.content}
    except Exception as exc:  # the outcome under test: the test asserts on it
        outcome.error = exc


def start_call(
    gateway: Any,
    *,
    stream: bool,
    max_tokens: int,
    rollout: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] = LONG_STORY,
    temperature: float = 1.0,
) -> tuple[dict[str, Any], Outcome, threading.Thread]:
    """A chat call running in a thread (a fresh rollout unless one is given)."""
    rollout = rollout or gateway.rollout()
    outcome = Outcome()
    thread = threading.Thread(
        target=chat_call,
        args=(gateway.openai(rollout), outcome),
        kwargs={"stream": stream, "max_tokens": max_tokens, "messages": messages, "temperature": temperature},
    )
    thread.start()
    return rollout, outcome, thread


def stored_whole(call: Call, stop_ids: Sequence[int], max_tokens: int) -> bool:
    """A recorded answer the policy ended (a stop token) or that used its whole budget: not cut short."""
    if call.finish_reason == "stop":
        return call.response_token_ids[-1] in stop_ids
    return call.finish_reason == "length" and len(call.response_token_ids) == max_tokens
