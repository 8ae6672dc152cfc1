"""Convert one step's harnessrl samples to verl's ``DataProto`` (and back), for verl-based trainers.

A harnessrl ``Sample`` is a whole chain of calls: the first call's prompt, then the sampled responses
with the tool output and template glue between them (loss mask 0). verl lays a row out as
``prompt + response`` with ``response_mask`` marking the policy's tokens, which is exactly how verl's
own multi-turn agent loop stores tool turns. So the first call's prompt (``input_ids[:spans[0].start]``)
becomes ``prompts`` and everything after it becomes ``responses``, with ``response_mask`` = loss mask.

Padding follows ``verl.experimental.agent_loop``: ``prompts`` left-padded, ``responses``
right-padded (with ``pad_token_id``), ``input_ids = cat(prompts, responses)``, ``attention_mask`` 1
on real tokens, ``position_ids = clip(cumsum(attention_mask) - 1, 0)``, ``rollout_log_probs`` 0 on
padding. Batch keys written (``(B, P)``, ``(B, L)``, ``(B, P + L)`` or ``(B,)``):

- ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``
- ``rollout_log_probs``: the engine's log-prob of each sampled token (harnessrl's behaviour log-probs)
- ``old_log_probs``: the same by default (harnessrl's default proximal policy: no trainer recompute);
  pass ``old_log_probs=False`` to let verl recompute them (then add TIS ``rollout_is_weights``)
- ``advantages``: the rollout's advantage on every loss token, 0 elsewhere (verl's GRPO layout)
- ``token_level_scores`` / ``token_level_rewards``: the reward on the last response token (only when
  every sample has a reward), which verl's metrics read
- ``rollout_loss_tokens``, ``step_rollouts``: the rollout-level normalizers read by
  ``harnessrl_ppo_loss`` (see ``harnessrl.integrations.verl_loss``)

Non-tensor keys (numpy object arrays): ``uid`` (the group: verl groups GRPO rows by it; the
rollout id when the sample has no group), ``group_id``, ``rollout_id``, ``sample_index``, ``task_id``, ``step``, ``reward``, ``advantage``, ``spans``
(``(start, end, policy_version, call_seq)`` in the unpadded sequence), ``min_global_steps`` /
``max_global_steps`` (oldest/newest policy version that sampled the row, verl's staleness fields).
``meta_info`` holds ``format``, ``num_rollouts``, ``num_loss_tokens`` and ``pad_token_id``.

Importing this module registers the ``harnessrl_rollout`` policy loss in verl.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from harnessrl.algorithms.packing import StepTotals, step_totals
from harnessrl.errors import EmptyBatch, InvalidBatch
from harnessrl.integrations.verl_loss import (
    LOSS_NAME,
    ROLLOUT_TOKENS_KEY,
    STEP_ROLLOUTS_KEY,
    compute_policy_loss_harnessrl_rollout,
    harnessrl_ppo_loss,
    rollout_token_weights,
    verl_actor_overrides,
)
from harnessrl.trajectory import Sample, SampledSpan

__all__ = [
    "FORMAT",
    "LOSS_NAME",
    "compute_policy_loss_harnessrl_rollout",
    "dataproto_to_samples",
    "harnessrl_ppo_loss",
    "rollout_token_weights",
    "samples_to_dataproto",
    "verl_actor_overrides",
]

FORMAT = "harnessrl.verl/v1"


def _prompt_length(sample: Sample) -> int:
    if not sample.spans:
        raise InvalidBatch(f"sample of rollout {sample.rollout_id} has no sampled span")
    p = sample.spans[0].start
    if p < 1:
        # verl's unpadding (no_padding_2_padding) reads the log-prob of the first response token
        # from the last prompt position: a row needs at least one prompt token.
        raise InvalidBatch(f"sample of rollout {sample.rollout_id} has an empty first prompt")
    return p


def _object_array(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def samples_to_dataproto(
    samples: Sequence[Sample],
    *,
    pad_token_id: int = 0,
    prompt_length: int | None = None,
    response_length: int | None = None,
    totals: StepTotals | None = None,
    old_log_probs: bool = True,
    dtype: torch.dtype = torch.float32,
) -> DataProto:
    """One row per sample, in order (see the module docstring for the layout).

    ``prompt_length`` / ``response_length`` fix the padded widths (default: the longest in the
    batch; a sample that does not fit is an error, never cut). ``totals`` are the step's
    normalizers, by default computed from ``samples``; pass the whole step's when ``samples`` is only
    part of it. Every sample needs its ``advantage``. ``dtype`` is that of the float tensors.
    """
    if not samples:
        raise EmptyBatch("no samples to convert")
    totals = totals if totals is not None else step_totals(samples)
    prompt_lens = [_prompt_length(s) for s in samples]
    response_lens = [len(s) - p for s, p in zip(samples, prompt_lens, strict=True)]
    P = max(prompt_lens) if prompt_length is None else prompt_length
    L = max(response_lens) if response_length is None else response_length
    if max(prompt_lens) > P:
        raise InvalidBatch(f"a first prompt has {max(prompt_lens)} tokens, more than prompt_length {P}")
    if max(response_lens) > L:
        raise InvalidBatch(f"a response part has {max(response_lens)} tokens, more than response_length {L}")

    B = len(samples)
    prompts = torch.full((B, P), pad_token_id, dtype=torch.long)
    responses = torch.full((B, L), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((B, P), dtype=torch.long)
    response_attn = torch.zeros((B, L), dtype=torch.long)
    response_mask = torch.zeros((B, L), dtype=torch.long)
    rollout_lp = torch.zeros((B, L), dtype=dtype)
    advantages = torch.zeros((B, L), dtype=dtype)
    rollout_tokens = torch.zeros((B,), dtype=torch.long)
    zero = torch.zeros((), dtype=dtype)
    for b, (s, p, n) in enumerate(zip(samples, prompt_lens, response_lens, strict=True)):
        if s.advantage is None:
            raise InvalidBatch(f"sample of rollout {s.rollout_id} has no advantage")
        try:
            r = totals.rollout_index(s)
        except KeyError as exc:
            raise InvalidBatch(f"rollout {s.rollout_id} is not in the given step totals") from exc
        prompts[b, P - p :] = torch.tensor(s.input_ids[:p], dtype=torch.long)  # left padding
        prompt_attn[b, P - p :] = 1
        responses[b, :n] = torch.tensor(s.input_ids[p:], dtype=torch.long)  # right padding
        response_attn[b, :n] = 1
        response_mask[b, :n] = torch.tensor(s.loss_mask[p:], dtype=torch.long)
        rollout_lp[b, :n] = torch.tensor(s.behaviour_logprobs[p:], dtype=dtype)
        # Both branches are tensors of ``dtype``: with Python float scalars torch.where makes float32
        # whatever ``dtype`` is, which rounds a float64 advantage (0.1 -> 0.10000000149011612).
        advantages[b] = torch.where(response_mask[b].bool(), torch.tensor(s.advantage, dtype=dtype), zero)
        rollout_tokens[b] = totals.rollout_token_counts_R[r]

    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)  # (B, P + L)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
        "response_mask": response_mask,
        "rollout_log_probs": rollout_lp,
        "advantages": advantages,
        ROLLOUT_TOKENS_KEY: rollout_tokens,
        STEP_ROLLOUTS_KEY: torch.full((B,), totals.num_rollouts, dtype=torch.long),
    }
    if old_log_probs:
        tensors["old_log_probs"] = rollout_lp.clone()
    if all(s.reward is not None for s in samples):
        scores = torch.zeros((B, L), dtype=dtype)
        scores[torch.arange(B), torch.tensor(response_lens) - 1] = torch.tensor(
            [float(s.reward) for s in samples], dtype=dtype
        )
        tensors["token_level_scores"] = scores
        tensors["token_level_rewards"] = scores.clone()

    versions = [[span.policy_version for span in s.spans] for s in samples]
    non_tensors = {
        "uid": _object_array([s.group_id if s.group_id is not None else s.rollout_id for s in samples]),
        "group_id": _object_array([s.group_id for s in samples]),
        "rollout_id": _object_array([s.rollout_id for s in samples]),
        "sample_index": _object_array([s.sample_index for s in samples]),
        "task_id": _object_array([s.task_id for s in samples]),
        "step": _object_array([s.step for s in samples]),
        "reward": _object_array([s.reward for s in samples]),
        "advantage": _object_array([s.advantage for s in samples]),
        "spans": _object_array(
            [tuple((sp.start, sp.end, sp.policy_version, sp.call_seq) for sp in s.spans) for s in samples]
        ),
        "min_global_steps": _object_array([min(v) for v in versions]),
        "max_global_steps": _object_array([max(v) for v in versions]),
    }
    meta = {
        "format": FORMAT,
        "num_rollouts": totals.num_rollouts,
        "num_loss_tokens": totals.num_loss_tokens,
        "pad_token_id": pad_token_id,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def dataproto_to_samples(data: DataProto) -> list[Sample]:
    """The samples a ``samples_to_dataproto`` batch was made from (padding removed).

    Log-probs come back in the batch's float dtype (exact when it was float64).
    """
    if data.meta_info.get("format") != FORMAT:
        raise InvalidBatch(f"not a {FORMAT} batch (format={data.meta_info.get('format')!r})")
    batch, extra = data.batch, data.non_tensor_batch
    P = batch["prompts"].shape[1]
    out: list[Sample] = []
    for b in range(len(data)):
        attn = batch["attention_mask"][b].bool()
        prompt = batch["prompts"][b][attn[:P]].tolist()
        n = int(attn[P:].sum())
        response = batch["responses"][b, :n].tolist()
        out.append(
            Sample(
                rollout_id=extra["rollout_id"][b],
                input_ids=prompt + response,
                loss_mask=[0] * len(prompt) + batch["response_mask"][b, :n].tolist(),
                behaviour_logprobs=[0.0] * len(prompt) + batch["rollout_log_probs"][b, :n].tolist(),
                spans=[SampledSpan(*span) for span in extra["spans"][b]],
                reward=extra["reward"][b],
                group_id=extra["group_id"][b],
                task_id=extra["task_id"][b],
                step=extra["step"][b],
                sample_index=int(extra["sample_index"][b]),
                advantage=extra["advantage"][b],
            )
        )
    return out
