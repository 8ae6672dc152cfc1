"""A real instruct model (SmolLM2-135M-Instruct, fp32) behind the gateway on real vLLM.

What the random tiny model cannot show: answers the policy ends itself with its end-of-turn token
(``finish_reason`` ``stop``), so the next turn splices in a response that already ends the turn;
greedy decoding; and logprob agreement on a peaked, trained distribution (135M parameters, 30
layers) rather than a near-uniform one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.vllm.vllm_support import LOGPROB_ATOL, max_abs_diff

from harnessrl.engines.launch import EngineServer
from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.tokenizer import PolicyTokenizer

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_instruct_model_answers_stop_and_chain_token_exactly(
    make_gateway: Any, smollm2_server: EngineServer, smollm2_dir: Path, reference: Any
) -> None:
    gateway = make_gateway(smollm2_server.engine_model, tokenizer=str(smollm2_dir))
    tokenizer = PolicyTokenizer.from_dir(smollm2_dir)
    rollout = gateway.rollout()
    client = gateway.openai(rollout)
    # Greedy: the one answer a 135M instruct model gives reliably.
    first_answer = client.chat.completions.create(
        model="smollm2", messages=QUESTION, max_tokens=64, temperature=0
    )
    content = first_answer.choices[0].message.content
    assert first_answer.choices[0].finish_reason == "stop" and "Paris" in content
    history = [
        *QUESTION,
        {"role": "assistant", "content": content},
        {"role": "user", "content": "And of Italy?"},
    ]
    pieces = []
    for chunk in client.chat.completions.create(
        model="smollm2", messages=history, max_tokens=64, temperature=0.7, stream=True
    ):
        pieces.extend(choice.delta.content or "" for choice in chunk.choices)

    first, second = gateway.store.list_calls(rollout["rollout_id"])
    assert first.prompt_token_ids == tokenizer.encode_chat(normalize_messages(QUESTION))
    assert first.finish_reason == "stop" and first.response_token_ids[-1] in tokenizer.stop_token_ids
    # The sampled end-of-turn token is reused as it is: nothing is added between the turns but the
    # template's glue and the new user turn.
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(head)] == head
    assert tokenizer.decode(second.prompt_token_ids[len(head) :]).startswith(
        "\n<|im_start|>user\nAnd of Italy?"
    )
    assert "".join(pieces) == second.response["content"]

    model = reference(smollm2_dir)
    # Greedy calls record the temperature-1 logprob (as the embedded engine does).
    greedy = model.logprobs(first.prompt_token_ids, first.response_token_ids, 1.0)
    assert max_abs_diff(first.response_logprobs, greedy) < LOGPROB_ATOL
    sampled = model.logprobs(second.prompt_token_ids, second.response_token_ids, 0.7)
    assert max_abs_diff(second.response_logprobs, sampled) < LOGPROB_ATOL
