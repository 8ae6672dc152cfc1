"""Shared-prefix rows: samples that start with the same tokens share one forward pass over them.

The rollouts of a group all start from the same prompt (an agent's system prompt and task, often
thousands of tokens), and every sample of a multi-sample rollout repeats the rollout's opening. A
plain packed row computes that prefix once per sample. Here the samples of a row are laid out as a
token trie flattened into one sequence: a sample contributes only the tokens after its longest
common prefix with the samples before it, and an explicit attention mask lets each token see exactly
its own sample's earlier tokens (the shared ones included). Position ids are depths in the trie, so
every token is computed in exactly the context it had in its own sample.

Because a shared token's hidden state is the same function of the weights in every sample that
contains it, the loss and its gradient equal those of computing each sample separately (tested in
``tests/trainer/test_prefix_tree.py``). Each trained token keeps its own entry (sample, advantage,
behaviour log-prob), even where two samples share it.

Layout: the loss is computed on a flat list of N trained-token entries, shape (1, N), which
``algorithms.losses.policy_loss`` handles like any (B, T) layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harnessrl.algorithms.losses import MicroBatch
from harnessrl.algorithms.packing import StepTotals
from harnessrl.errors import EmptyBatch, InvalidBatch
from harnessrl.token_ids import common_prefix
from harnessrl.trajectory import Sample


def prefix_micro_batches(
    samples: Sequence[Sample], micro_batch_tokens: int, row_tokens: int
) -> list[list[list[Sample]]]:
    """Micro-batches of rows of samples, in token order so that prefix-sharing samples are adjacent.

    A sample costs the tokens it adds to its row (its length minus its common prefix with the
    previous sample in the row — in sorted order that is its longest common prefix with any earlier
    one). Rows hold at most ``max(row_tokens, longest sample)`` tokens, micro-batches at most
    ``max(micro_batch_tokens, longest sample)`` computed tokens.
    """
    if not samples:
        return []
    longest = max(len(s) for s in samples)
    row_cap = max(row_tokens, longest)
    micro_cap = max(micro_batch_tokens, longest)
    ordered = sorted(samples, key=lambda s: s.input_ids)
    micro_batches: list[list[list[Sample]]] = [[[]]]
    row_used = micro_used = 0
    for sample in ordered:
        row = micro_batches[-1][-1]
        shared = common_prefix(row[-1].input_ids, sample.input_ids) if row else 0
        cost = len(sample) - shared
        if row and row_used + cost > row_cap:
            shared, cost = 0, len(sample)
            if micro_used + cost > micro_cap:
                micro_batches.append([[]])
                micro_used = 0
            else:
                micro_batches[-1].append([])
            row_used = 0
        elif row and micro_used + cost > micro_cap:
            shared, cost = 0, len(sample)
            micro_batches.append([[]])
            row_used = micro_used = 0
        micro_batches[-1][-1].append(sample)
        row_used += cost
        micro_used += cost
    return micro_batches


@dataclass(slots=True)
class PrefixBatch:
    """One micro-batch in shared-prefix rows, ready for ``TrainablePolicy``.

    ``attention_B_T_T[b, q, k]`` is True where token q of row b may attend to token k.
    ``entries`` is the (1, N) loss layout: trained token n is predicted from the hidden state at
    ``(hidden_row_N[n], hidden_col_N[n])`` and is token ``targets_N[n]``.
    """

    input_ids_B_T: torch.Tensor  # (B, T) long
    position_ids_B_T: torch.Tensor  # (B, T) long
    attention_B_T_T: torch.Tensor  # (B, T, T) bool
    hidden_row_N: torch.Tensor  # (N,) long
    hidden_col_N: torch.Tensor  # (N,) long
    targets_N: torch.Tensor  # (N,) long
    entries: MicroBatch  # (1, N) tensors; input/position ids unused
    computed_tokens: int  # tokens actually run through the model (shared ones once)
    sample_tokens: int  # tokens the samples hold in total


def prefix_batch(
    rows: Sequence[Sequence[Sample]], totals: StepTotals, *, pad_token_id: int = 0
) -> PrefixBatch:
    """Flatten each row's samples into a trie sequence with its attention mask and loss entries.

    Samples in a row must be in the order ``prefix_micro_batches`` gives (sorted), so that each
    sample's longest common prefix with the earlier ones is the one with its predecessor.
    """
    if not rows or not any(rows):
        raise EmptyBatch("cannot build an empty micro-batch")
    flat_ids: list[list[int]] = []
    flat_pos: list[list[int]] = []
    # per row: (shared path, start, end) of each sample's new segment, to build the mask with
    segments: list[list[tuple[list[int], int, int]]] = []
    hidden_row: list[int] = []
    hidden_col: list[int] = []
    targets: list[int] = []
    behaviour: list[float] = []
    advantages: list[float] = []
    rollout_index: list[int] = []
    sample_index: list[int] = []
    sample_tokens = 0
    for b, row in enumerate(rows):
        ids: list[int] = []
        pos: list[int] = []
        row_segments: list[tuple[list[int], int, int]] = []
        previous: Sample | None = None
        previous_path: list[int] = []
        for sample in row:
            if sample.advantage is None:
                raise InvalidBatch(f"sample of rollout {sample.rollout_id} has no advantage")
            shared = common_prefix(previous.input_ids, sample.input_ids) if previous else 0
            path = previous_path[:shared]
            start = len(ids)
            row_segments.append((list(path), start, start + len(sample) - shared))
            path.extend(range(start, start + len(sample) - shared))
            ids.extend(sample.input_ids[shared:])
            pos.extend(range(shared, len(sample)))
            r, s = totals.rollout_index(sample), totals.sample_index(sample)
            for k in range(1, len(sample)):
                if sample.loss_mask[k]:
                    hidden_row.append(b)
                    hidden_col.append(path[k - 1])
                    targets.append(sample.input_ids[k])
                    behaviour.append(sample.behaviour_logprobs[k])
                    advantages.append(sample.advantage)
                    rollout_index.append(r)
                    sample_index.append(s)
            sample_tokens += len(sample)
            previous, previous_path = sample, path
        flat_ids.append(ids)
        flat_pos.append(pos)
        segments.append(row_segments)

    T = max(len(ids) for ids in flat_ids)
    B = len(rows)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((B, T), dtype=torch.long)
    attention = torch.zeros((B, T, T), dtype=torch.bool)
    for b in range(B):
        n = len(flat_ids[b])
        input_ids[b, :n] = torch.tensor(flat_ids[b], dtype=torch.long)
        position_ids[b, :n] = torch.tensor(flat_pos[b], dtype=torch.long)
        for shared_path, start, end in segments[b]:
            # a new segment sees its shared prefix and itself causally
            if shared_path:
                attention[b, start:end, torch.tensor(shared_path, dtype=torch.long)] = True
            attention[b, start:end, start:end] = torch.ones(
                (end - start, end - start), dtype=torch.bool
            ).tril()
        # Padding attends only to itself (a row with no visible key would give NaN) and is never read.
        attention[b, range(n, T), range(n, T)] = True
    N = len(targets)
    entries = MicroBatch(
        input_ids_B_T=torch.zeros((1, N), dtype=torch.long),
        position_ids_B_T=torch.zeros((1, N), dtype=torch.long),
        loss_mask_B_T=torch.ones((1, N), dtype=torch.bool),
        behaviour_logprobs_B_T=torch.tensor([behaviour], dtype=torch.float32).reshape(1, N),
        advantages_B_T=torch.tensor([advantages], dtype=torch.float32).reshape(1, N),
        rollout_index_B_T=torch.tensor([rollout_index], dtype=torch.long).reshape(1, N),
        sample_index_B_T=torch.tensor([sample_index], dtype=torch.long).reshape(1, N),
    )
    return PrefixBatch(
        input_ids_B_T=input_ids,
        position_ids_B_T=position_ids,
        attention_B_T_T=attention,
        hidden_row_N=torch.tensor(hidden_row, dtype=torch.long),
        hidden_col_N=torch.tensor(hidden_col, dtype=torch.long),
        targets_N=torch.tensor(targets, dtype=torch.long),
        entries=entries,
        computed_tokens=sum(len(ids) for ids in flat_ids),
        sample_tokens=sample_tokens,
    )
