"""One SFT optimizer step: token-mean cross-entropy on the answer tokens of a batch of sequences.

    loss = -(1 / N) * sum over answer tokens t of log p(token_t | tokens < t)      N = answer tokens in the step

at temperature 1, summed over micro-batches with the step's N, so accumulating micro-batches gives
exactly the whole batch's loss. It works on the policy's ``Learner`` (``trainer.train_step``: model,
optimizer, LR schedule, grad clip) and its forward (``trainer.forward.sequence_logprobs``: the LM head
only where a loss token is), with the RL step's micro-batch layouts: shared-prefix rows
(``prefix_tree``, when the policy's ``share_prefixes`` is on: a prefix that several sequences of the
step share — a harness's system prompt and tools, thousands of tokens — runs through the model once,
each sequence's own tokens attending to it) or packed rows (``train_step.packed_rows``: sequences
packed into rows with restarting position ids, so none attends to another). Both give the same loss
and gradient (tests/sft/test_step.py). Where it departs from
the RL step: no advantages, no behaviour log-probs, every answer token weighs the same (a token
mean over the step, as TRL's ``SFTTrainer`` does), and one process only.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from harnessrl.algorithms.packing import pack_micro_batches, step_totals
from harnessrl.trainer.forward import TokenLogprobs, prefix_logprobs, sequence_logprobs
from harnessrl.trainer.prefix_tree import prefix_batch, prefix_micro_batches
from harnessrl.trainer.train_step import Learner, packed_rows, to_device
from harnessrl.trajectory import Sample


def answer_logprobs(
    learner: Learner, samples: list[Sample], micro_batch_tokens: int
) -> Iterator[tuple[TokenLogprobs, torch.Tensor, int]]:
    """Per micro-batch: the answer tokens' log-probs, their loss mask (same layout) and the tokens
    the forward pass ran, in the policy's layout (shared-prefix rows or packed rows)."""
    config = learner.config
    totals = step_totals(samples)
    if config.share_prefixes:
        for rows in prefix_micro_batches(samples, micro_batch_tokens, config.row_tokens):
            batch = to_device(prefix_batch(rows, totals), learner.device)
            out = prefix_logprobs(learner.model, batch, 1.0, autocast=learner.autocast)
            yield out, batch.entries.loss_mask_B_T, batch.computed_tokens
        return
    for micro_samples in pack_micro_batches(samples, micro_batch_tokens):
        micro = to_device(packed_rows(micro_samples, totals, config.row_tokens), learner.device)
        mask_B_T = micro.loss_mask_B_T
        out = sequence_logprobs(
            learner.model,
            micro.input_ids_B_T,
            micro.position_ids_B_T,
            1.0,
            mask_B_T,
            autocast=learner.autocast,
        )
        yield out, mask_B_T, int(micro.input_ids_B_T.numel())


def sft_step(learner: Learner, samples: list[Sample], *, micro_batch_tokens: int) -> dict[str, float]:
    """One optimizer step over ``samples`` (``advantage`` set, as ``render.rollout_sequences`` does)."""
    totals = step_totals(samples)
    n_tokens = totals.num_loss_tokens
    if n_tokens == 0:
        return {"sft/loss": 0.0, "sft/skipped": 1.0}
    learner.optimizer.zero_grad(set_to_none=True)
    loss_sum = 0.0
    correct = 0
    forward_tokens = 0
    for out, mask_B_T, computed in answer_logprobs(learner, samples, micro_batch_tokens):
        logprobs_B_T = out.logprobs
        loss = -(logprobs_B_T * mask_B_T).sum() / n_tokens
        loss.backward()
        loss_sum += float(loss.detach())
        # A token is "predicted" when it had probability above 1/2: then it is surely the argmax.
        correct += int(((logprobs_B_T.detach() > -0.6931471805599453) & mask_B_T).sum())
        forward_tokens += computed
    # The norm before clipping, reported with clipping off too (max_norm inf scales by 1: no change).
    grad_clip = learner.config.optimizer.grad_clip or float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(learner.model.parameters(), grad_clip))
    lr = learner.scheduler.get_last_lr()[0]
    learner.optimizer.step()
    learner.scheduler.step()
    return {
        "sft/loss": loss_sum,
        "sft/perplexity": float(torch.tensor(loss_sum).exp()),
        "sft/token_p_over_half": correct / n_tokens,
        "sft/loss_tokens": float(n_tokens),
        "sft/sequences": float(len(samples)),
        "sft/forward_tokens": float(forward_tokens),
        "sft/grad_norm": grad_norm,
        "sft/lr": lr,
    }
