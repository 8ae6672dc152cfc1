"""The logprobs recorded from a real vLLM server are those of the distribution each token was
sampled from: they equal a transformers forward pass of the same model folder, tempered
(``log_softmax(logits / T)``), within 1e-3 (fp32 on CPU: ~1e-6 measured).

Top-p: vLLM with ``--logprobs-mode processed_logprobs`` reports logprobs renormalised over the
nucleus when ``top_p < 1``. A training rollout's ``metadata.sampling`` forces ``top_p = 1``, so what
is recorded is the full tempered softmax the trainer computes (the regression test for bug 3); when
a harness's ``top_p`` is not overridden, the recorded logprob is that of the truncated distribution
actually sampled from (the control).
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.vllm.vllm_support import LOGPROB_ATOL, max_abs_diff

from harnessrl.schemas import Call

pytestmark = pytest.mark.vllm

MESSAGES = [{"role": "user", "content": "Write a short poem about the sea and the wind."}]
MAX_TOKENS = 48


def sampled_call(gateway: Any, *, metadata: dict[str, Any] | None = None, **sampling: Any) -> Call:
    rollout = gateway.rollout(metadata=metadata)
    gateway.openai(rollout).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, **sampling
    )
    [call] = gateway.store.list_calls(rollout["rollout_id"])
    assert len(call.response_token_ids) == len(call.response_logprobs) > 0
    return call


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recorded_logprobs_equal_a_forward_pass(
    gateway: Any, reference: Any, tiny_dir: Any, temperature: float
) -> None:
    call = sampled_call(gateway, temperature=temperature)
    model = reference(tiny_dir)
    expected = model.logprobs(call.prompt_token_ids, call.response_token_ids, temperature)
    assert max_abs_diff(call.response_logprobs, expected) < LOGPROB_ATOL
    if temperature != 1.0:  # control: the temperature is really applied
        untempered = model.logprobs(call.prompt_token_ids, call.response_token_ids, 1.0)
        assert max_abs_diff(call.response_logprobs, untempered) > 0.05


def test_rollout_sampling_override_keeps_the_full_softmax(
    gateway: Any, reference: Any, tiny_dir: Any
) -> None:
    """The harness asks for top_p=0.5; the trainer's rollout forces top_p=1.0."""
    call = sampled_call(
        gateway, metadata={"sampling": {"temperature": 1.0, "top_p": 1.0}}, temperature=0.7, top_p=0.5
    )
    assert call.request["top_p"] == 0.5
    expected = reference(tiny_dir).logprobs(call.prompt_token_ids, call.response_token_ids, 1.0)
    assert max_abs_diff(call.response_logprobs, expected) < LOGPROB_ATOL


def test_unforced_top_p_records_the_nucleus_distribution(gateway: Any, reference: Any, tiny_dir: Any) -> None:
    """Control: with top_p=0.3 left as the harness asked, vLLM reports logprobs renormalised over the
    nucleus: never below the full softmax's, and above it for some token."""
    call = sampled_call(gateway, temperature=1.0, top_p=0.3)
    full = reference(tiny_dir).logprobs(call.prompt_token_ids, call.response_token_ids, 1.0)
    gaps = [got - want for got, want in zip(call.response_logprobs, full, strict=True)]
    assert min(gaps) > -LOGPROB_ATOL
    assert max(gaps) > 0.05
