"""``harnessrl train`` of the tiny example against a real vLLM server (``engine.model = vllm:URL``):
the trainer trains ``trainer.model``'s weights, reloads them into the server after every step, and
at the end the server serves exactly the final checkpoint. The same run against a fake vLLM is in
``tests/trainer/test_train_end_to_end.py``; here the reload, the versions and the served weights are
real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.vllm.vllm_support import LOGPROB_ATOL, direct_completion, max_abs_diff

from harnessrl.engines.launch import EngineServer
from harnessrl.store.sqlite import SQLiteStore

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here"),
]

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "tiny" / "train.toml"


def versions_by_step(run_dir: Path) -> dict[int, set[int]]:
    """Policy versions of the calls of the rollouts each step trained on."""
    store = SQLiteStore(run_dir / "harnessrl.db")
    try:
        by_step: dict[int, set[int]] = {}
        for rollout in store.list_rollouts(run_id="tiny-vowels"):
            step = rollout.metadata.get("trained_at_step")
            if step is not None:
                versions = {c.policy_version for c in store.list_calls(rollout.rollout_id)}
                by_step.setdefault(step, set()).update(versions)
        return by_step
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_steps_reload_the_server_which_then_serves_the_final_checkpoint(
    tiny_server: EngineServer,
    tiny_dir: Path,
    tokenizer: Any,
    reference: Any,
    restore_weights: None,
    tmp_path: Path,
    mode: str,
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, "-m", "harnessrl", "train", str(CONFIG),
            "--set", f"run.dir={run_dir}",
            "--set", "metrics.progress=false",
            "--set", f"engine.model={tiny_server.engine_model}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", f"trainer.mode={mode}",
            "--set", "trainer.steps=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 2
    # The folder the server loaded last is kept; the one before it was removed once replaced.
    assert [p.name for p in (run_dir / "engine-weights").iterdir()] == ["v2"]

    by_step = versions_by_step(run_dir)
    if mode == "sync":
        assert by_step == {1: {0}, 2: {1}}  # step 2 sampled only after the first reload
    else:
        assert by_step[1] == {0} and set(by_step) == {1, 2} and by_step[2] <= {0, 1}

    prompt = tokenizer.encode_chat([{"role": "user", "content": "Task 0: reply with vowels only."}])
    answer = direct_completion(tiny_server.url, prompt, max_tokens=16, temperature=1.0)
    final = reference(Path(summary["final_checkpoint"])).logprobs(prompt, answer["token_ids"])
    assert max_abs_diff(answer["logprobs"], final) < LOGPROB_ATOL
    initial = reference(tiny_dir).logprobs(prompt, answer["token_ids"])
    assert max_abs_diff(answer["logprobs"], initial) > 0.01  # control: training changed the weights


def test_torchrun_trains_against_the_server_after_the_served_weights_check(
    tiny_server: EngineServer,
    tokenizer: Any,
    reference: Any,
    restore_weights: None,
    tmp_path: Path,
) -> None:
    """docs/scale.md step 5: ``torchrun -m harnessrl.trainer.torchrun`` with remote vLLM servers. The
    run first checks that the server serves the trainer's weights (``served_weights_check`` asks the
    policy for its logprobs: on 2 ranks a collective), then trains and reloads the server. The
    torchrun policies used to lack ``response_logprobs``, so this run died before its first rollout."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--log-dir", str(tmp_path / "torchrun-logs"),  # not a torchelastic_* folder left in /tmp
            "-m", "harnessrl.trainer.torchrun", str(CONFIG),
            "--set", f"run.dir={run_dir}",
            "--set", f"engine.model={tiny_server.engine_model}",
            "--set", "engine.tokenizer=tiny",
            "--set", "trainer.model=tiny",
            "--set", "trainer.mode=sync",
            "--set", "trainer.steps=1",
            "--set", "trainer.tasks_per_step=2",
            "--set", "trainer.group_size=4",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"engine at {tiny_server.url} serves the trainer's weights" in proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1 and summary["world_size"] == 2
    assert versions_by_step(run_dir) == {1: {0}}

    prompt = tokenizer.encode_chat([{"role": "user", "content": "Task 0: reply with vowels only."}])
    answer = direct_completion(tiny_server.url, prompt, max_tokens=16, temperature=1.0)
    final = reference(Path(summary["final_checkpoint"])).logprobs(prompt, answer["token_ids"])
    assert max_abs_diff(answer["logprobs"], final) < LOGPROB_ATOL  # the sharded weights, gathered
