"""Convert one step's harnessrl samples to verl's ``DataProto`` (and back), for verl-based trainers.

A harnessrl ``Sample`` is a whole chain of calls: the first call's prompt, then the sampled responses
with the tool output and template glue between them (loss mask 0). verl lays a row out as
``prompt + response`` with ``response_mask`` marking the policy's tokens, which is exactly how verl's
own multi-turn agent loop stores tool turns. So the first call's prompt (the tokens before the
earliest span) becomes ``prompts`` and everything after it becomes ``responses``, with
``response_mask`` = loss mask.

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
``meta_info`` holds ``format``, ``num_rollouts``, ``num_loss_tokens``, ``num_samples``, ``filler_rows``
(see ``row_multiple``) and ``pad_token_id``.

Importing this module registers the ``harnessrl_rollout`` policy loss in verl.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from harnessrl.algorithms.packing import StepTotals, step_totals
from harnessrl.errors import ConfigError, EmptyBatch, InvalidBatch
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
from harnessrl.trajectory.samples import loss_token_outside_spans

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


_MAX_TOKEN_ID = 2**63 - 1  # the largest id a torch.long tensor holds


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _first_bad(values: Sequence[Any], ok: Callable[[Any], bool]) -> tuple[int, Any] | None:
    return next(((t, v) for t, v in enumerate(values) if not ok(v)), None)


def _finite(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past a float's range
        return False


def _prompt_length(sample: Sample) -> int:
    """The first prompt's length, after refusing what verl's tensors would hold wrong or not at all.

    A ``Sample`` is a plain dataclass (hand-built, or read from an export file): per-token lists of
    different lengths were broadcast into the rows, a loss token before the first span was trained
    as prompt (dropped) while still counted in the rollout's normalizer, a token id past int64 or a
    non-finite number raised a bare torch error or went into the loss as NaN.
    """
    where = f"sample {sample.sample_index} of rollout {sample.rollout_id}"
    T = len(sample.input_ids)
    if len(sample.loss_mask) != T or len(sample.behaviour_logprobs) != T:
        raise InvalidBatch(
            f"{where}: input_ids, loss_mask and behaviour_logprobs have lengths "
            f"{T}, {len(sample.loss_mask)} and {len(sample.behaviour_logprobs)} (they must be equal)"
        )
    if not sample.spans:
        raise InvalidBatch(f"{where} has no sampled span")
    for span in sample.spans:
        if not 0 <= span.start <= span.end <= T:
            raise InvalidBatch(f"{where}: span [{span.start}, {span.end}) is outside its {T} tokens")
    p = min(span.start for span in sample.spans)
    if p < 1:
        # verl's unpadding (no_padding_2_padding) reads the log-prob of the first response token
        # from the last prompt position: a row needs at least one prompt token.
        raise InvalidBatch(f"{where} has an empty first prompt")
    if p == T:
        raise InvalidBatch(f"{where} has no token after its first prompt (every response is empty)")
    # A C-level pass per list; the per-token check runs only when it fails (numpy ints, say), and
    # decides.
    mask = sample.loss_mask
    if not (set(map(type, mask)) <= {int} and set(mask) <= {0, 1}) and (
        bad := _first_bad(mask, lambda m: _integer(m) and m in (0, 1))
    ):
        raise InvalidBatch(f"{where}: loss_mask[{bad[0]}] is {bad[1]!r}, not 0 or 1")
    if any(mask[:p]):
        t = next(t for t, m in enumerate(mask) if m)
        raise InvalidBatch(
            f"{where}: loss_mask[{t}] is 1 before its first sampled span (at {p}); verl's prompt part "
            "is never trained, so that token would be lost"
        )
    if (outside := loss_token_outside_spans(sample.loss_mask, sample.spans)) is not None:
        # verl's response_mask is the loss mask: that token (tool output, template glue) was trained
        # as if the policy had sampled it, against a behaviour log-prob of 0.0.
        raise InvalidBatch(f"{where}: loss_mask[{outside}] is 1 but no span holds token {outside}")
    ids = sample.input_ids
    if not (set(map(type, ids)) <= {int} and min(ids) >= 0 and max(ids) <= _MAX_TOKEN_ID) and (
        bad := _first_bad(ids, lambda v: _integer(v) and 0 <= v <= _MAX_TOKEN_ID)
    ):
        raise InvalidBatch(f"{where}: input_ids[{bad[0]}] is {bad[1]!r}, not a token id in [0, 2**63 - 1]")
    logprobs = sample.behaviour_logprobs
    if not (set(map(type, logprobs)) <= {float} and math.isfinite(sum(logprobs))) and (
        bad := _first_bad(logprobs, _finite)
    ):
        raise InvalidBatch(f"{where}: behaviour_logprobs[{bad[0]}] is {bad[1]!r}, not a finite number")
    for name in ("advantage", "reward"):
        value = getattr(sample, name)
        if value is not None and not _finite(value):
            raise InvalidBatch(f"{where}: {name} is {value!r}, not a finite number")
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
    row_multiple: int = 1,
) -> DataProto:
    """One row per sample, in order (see the module docstring for the layout).

    ``prompt_length`` / ``response_length`` fix the padded widths (default: the longest in the
    batch; a sample that does not fit is an error, never cut). Each sample is checked first
    (``InvalidBatch`` naming it): per-token lists of one length, spans inside the sequence, at least
    one prompt and one response token, no loss token in the prompt, token ids in ``[0, 2**63 - 1]``,
    finite log-probs, reward and advantage. ``totals`` are the step's
    normalizers, by default computed from ``samples``; pass the whole step's when ``samples`` is only
    part of it. Every sample needs its ``advantage``. ``dtype`` is that of the float tensors
    (a floating-point torch dtype, else ``ConfigError``).

    ``row_multiple``: append filler rows until the row count is a multiple of it (pass verl's
    data-parallel size: its dispatch splits a batch evenly over the ranks and asserts otherwise).
    A filler row is one ``pad_token_id`` prompt token and one response token with ``response_mask``
    0, so it adds nothing to any loss; its ``rollout_id`` is None and ``dataproto_to_samples`` drops
    it. (verl's own ``DataProto.padding`` repeats real rows, which this loss would count twice.)
    """
    if not samples:
        raise EmptyBatch("no samples to convert")
    if not (_integer(pad_token_id) and 0 <= pad_token_id <= _MAX_TOKEN_ID):
        raise ConfigError(f"pad_token_id is {pad_token_id!r}, not a token id in [0, 2**63 - 1]")
    if not (_integer(row_multiple) and row_multiple >= 1):
        raise ConfigError(f"row_multiple is {row_multiple!r}, not an integer >= 1")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        # torch.int64 truncated every advantage and log-prob toward 0 (0.5 -> 0): nothing learned
        raise ConfigError(f"dtype is {dtype!r}, not a torch floating-point dtype")
    for name, width in (("prompt_length", prompt_length), ("response_length", response_length)):
        # A float width went as far as torch.full (a TypeError traceback), 0 or a bool was taken
        # for a width and then blamed on a sample.
        if width is not None and not (_integer(width) and width >= 1):
            raise ConfigError(f"{name} is {width!r}, not an integer >= 1")
    prompt_lens = [_prompt_length(s) for s in samples]  # checks each sample first
    totals = totals if totals is not None else step_totals(samples)
    response_lens = [len(s) - p for s, p in zip(samples, prompt_lens, strict=True)]
    P = max(prompt_lens) if prompt_length is None else prompt_length
    L = max(response_lens) if response_length is None else response_length
    for s, p, n in zip(samples, prompt_lens, response_lens, strict=True):
        where = f"sample {s.sample_index} of rollout {s.rollout_id}"
        if p > P:
            raise InvalidBatch(f"{where}: its first prompt has {p} tokens, more than prompt_length {P}")
        if n > L:
            raise InvalidBatch(f"{where}: its response part has {n} tokens, more than response_length {L}")
        if s.advantage is None:
            raise InvalidBatch(f"{where} has no advantage")
        try:
            totals.rollout_index(s)
        except KeyError as exc:
            raise InvalidBatch(f"{where}: rollout {s.rollout_id} is not in the given step totals") from exc

    n_samples = len(samples)
    B = -(-n_samples // row_multiple) * row_multiple  # rows, with the filler ones
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
        r = totals.rollout_index(s)  # every sample checked above: advantage set, rollout in totals
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
    prompt_attn[n_samples:, P - 1] = 1  # filler rows: one pad prompt token, one pad response token
    response_attn[n_samples:, 0] = 1

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
        scores[torch.arange(n_samples), torch.tensor(response_lens) - 1] = torch.tensor(
            [float(s.reward) for s in samples], dtype=dtype
        )
        tensors["token_level_scores"] = scores
        tensors["token_level_rewards"] = scores.clone()

    versions = [[span.policy_version for span in s.spans] for s in samples]
    fill = B - n_samples
    oldest, newest = min(map(min, versions)), max(map(max, versions))

    def column(values: list[Any], filler: Any) -> np.ndarray:
        return _object_array(values + [filler] * fill)

    non_tensors = {
        "uid": _object_array(
            [s.group_id if s.group_id is not None else s.rollout_id for s in samples]
            + [f"harnessrl-filler-{i}" for i in range(fill)]  # a group of its own each
        ),
        "group_id": column([s.group_id for s in samples], None),
        "rollout_id": column([s.rollout_id for s in samples], None),
        "sample_index": column([s.sample_index for s in samples], None),
        "task_id": column([s.task_id for s in samples], None),
        "step": column([s.step for s in samples], None),
        "reward": column([s.reward for s in samples], None),
        "advantage": column([s.advantage for s in samples], None),
        "spans": column(
            [tuple((sp.start, sp.end, sp.policy_version, sp.call_seq) for sp in s.spans) for s in samples], ()
        ),
        "min_global_steps": column([min(v) for v in versions], oldest),
        "max_global_steps": column([max(v) for v in versions], newest),
    }
    meta = {
        "format": FORMAT,
        "num_rollouts": totals.num_rollouts,
        "num_loss_tokens": totals.num_loss_tokens,
        "num_samples": totals.num_samples,
        "filler_rows": fill,
        "pad_token_id": pad_token_id,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def dataproto_to_samples(data: DataProto) -> list[Sample]:
    """The samples a ``samples_to_dataproto`` batch was made from (padding and filler rows removed).

    Log-probs come back in the batch's float dtype (exact when it was float64).
    """
    if data.meta_info.get("format") != FORMAT:
        raise InvalidBatch(f"not a {FORMAT} batch (format={data.meta_info.get('format')!r})")
    batch, extra = data.batch, data.non_tensor_batch
    P = batch["prompts"].shape[1]
    out: list[Sample] = []
    for b in range(len(data)):
        if extra["rollout_id"][b] is None:  # a filler row (row_multiple)
            continue
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
