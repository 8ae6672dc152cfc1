"""The usage block of docs/trajectories.md, run as written on a tiny model: each sample of a packed
micro-batch gets the log-probs it gets alone (no attention across samples)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from harnessrl.algorithms import AlgorithmConfig, assign_advantages, rollout_advantages, step_totals
from harnessrl.algorithms.losses import collate, token_logprobs
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.trajectory import build_batch

DOC = Path(__file__).resolve().parents[2] / "docs" / "trajectories.md"


def documented_micro_batch_forward() -> str:
    """The documented loop body from ``mb = collate(...)`` up to the loss, dedented, as written."""
    usage = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert usage is not None, "docs/trajectories.md lost its usage block"
    body = re.search(r"^( +mb = collate\(.*?)^ +out = micro_batch_loss", usage.group(1), re.S | re.M)
    assert body is not None, "the usage block no longer collates, runs the model and takes the loss"
    return textwrap.dedent(body.group(1))


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    # As a user loads it: the model's own config, its KV cache on by default.
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir()), dtype=torch.float32).eval()


def test_the_documented_packed_forward_gives_each_sample_its_own_logprobs(model):
    rollouts, calls = [], []
    for i, (prompt, response) in enumerate(
        [([5, 17, 99, 3], [42, 7]), ([11, 12], [13, 14, 15]), ([8], [9, 10])]
    ):
        rollout_id = f"r{i}"
        rollouts.append(Rollout(rollout_id=rollout_id, api_key="k", task_id="t", step=0,
                                reward=float(i), outcome=Outcome.SUCCESS))  # fmt: skip
        calls.append([Call(rollout_id=rollout_id, seq=0, prompt_token_ids=prompt, response_token_ids=response,
                           response_logprobs=[-0.5] * len(response))])  # fmt: skip
    batch = build_batch(list(zip(rollouts, calls, strict=True)))
    samples = assign_advantages(batch.samples, rollout_advantages(rollouts, AlgorithmConfig()))
    totals = step_totals(samples)
    assert len(samples) == 3

    temperature = 0.7  # the engine's sampling temperature, which the behaviour logprobs are at
    scope = {"collate": collate, "token_logprobs": token_logprobs, "model": model, "micro": samples,
             "totals": totals, "temperature": temperature}  # fmt: skip
    with torch.no_grad():
        exec(documented_micro_batch_forward(), scope)
        packed_T = scope["logprobs_B_T"][0]
        start = 0
        for sample in samples:
            ids = torch.tensor([sample.input_ids])
            alone_T = token_logprobs(model(ids, use_cache=False).logits / temperature, ids)[0]
            # Position 0 of a sample has no prediction; every later one must not see earlier samples.
            got_T = packed_T[start + 1 : start + len(sample)]
            torch.testing.assert_close(got_T, alone_T[1:], atol=1e-5, rtol=1e-5)
            start += len(sample)
