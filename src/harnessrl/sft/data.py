"""The training data of an SFT run: the selected rollouts of a store, rendered for the student, and
the order its steps take them in. No torch.

The order is a pure function of the data and ``run.seed`` (``StepPlan``): epoch ``e`` takes the
sequences in a permutation seeded by ``(seed, e)``, ``sequences_per_step`` at a time (the last batch
of an epoch may be smaller). So a resumed run recomputes exactly the batches the interrupted one
would have trained on, provided the selection is the same; the run's checkpoints keep the selected
rollout IDs to check that.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.formats import ModelFormats, resolve_formats
from harnessrl.sft.config import SftConfig
from harnessrl.sft.render import RenderReport, rollout_sequences
from harnessrl.sft.select import Selected, Selection, select_rollouts
from harnessrl.store import open_store
from harnessrl.store.base import Store
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trajectory import Sample


def open_source(config: SftConfig) -> Store:
    """The store the rollouts are in; ``ConfigError`` naming the field if there is none."""
    source = config.source
    url = source.url()
    if "://" not in url:
        path = Path(url)
        if not path.is_file():
            field = "source.run_dir" if source.run_dir is not None else "source.store_url"
            where = source.run_dir if source.run_dir is not None else url
            raise ConfigError(f"{field}: no recorded rollouts at {where!r} ({path} does not exist)")
    return open_store(url)


def selection_of(config: SftConfig) -> Selection:
    s = config.select
    return Selection(min_reward=s.min_reward, allow_flags=tuple(s.allow_flags), max_rollouts=s.max_rollouts)


def select_from(store: Store, config: SftConfig) -> Selected:
    """The selected rollouts; ``ConfigError`` (with the counts of why) when none is."""
    selected = select_rollouts(store.list_rollouts(run_id=config.source.run_name), selection_of(config))
    if not selected.rollouts:
        run = f" of run {config.source.run_name!r}" if config.source.run_name else ""
        raise ConfigError(
            f"select: no recorded rollout{run} matches the selection: {selected.describe()}; "
            f"min_reward = {config.select.min_reward}, allow_flags = {config.select.allow_flags}"
        )
    return selected


@dataclass
class SftData:
    selected: Selected
    samples: list[Sample]
    report: RenderReport
    formats: ModelFormats

    @property
    def rollout_ids(self) -> list[str]:
        return [r.rollout_id for r in self.selected.rollouts]

    def summary(self) -> dict[str, Any]:
        return {
            "rollouts_considered": self.selected.considered,
            "rollouts_selected": len(self.selected.rollouts),
            "rollouts_dropped": dict(self.selected.dropped),
            "calls": self.report.calls,
            "calls_rendered": self.report.rendered,
            "calls_skipped": dict(self.report.skipped),
            "skipped_examples": self.report.examples,
            "chain_breaks": dict(self.report.breaks),
            "sequences": len(self.samples),
            "answer_tokens": sum(s.num_loss_tokens for s in self.samples),
            "tokens": sum(len(s) for s in self.samples),
            "tool_call_parser": self.formats.tool_parser,
            "reasoning_parser": self.formats.reasoning_parser,
        }


def load_data(config: SftConfig, model_dir: Path) -> SftData:
    """Select, read and render the rollouts for the student in ``model_dir``."""
    tokenizer = PolicyTokenizer.from_dir(model_dir)
    s = config.sft
    formats = resolve_formats(s.tool_call_parser, s.reasoning_parser, tokenizer.chat_template)
    store = open_source(config)
    try:
        selected = select_from(store, config)
        samples: list[Sample] = []
        report = RenderReport()
        for rollout in selected.rollouts:
            got, part = rollout_sequences(
                rollout,
                store.list_calls(rollout.rollout_id),
                tokenizer,
                formats,
                max_sample_tokens=s.max_sequence_tokens,
                template_kwargs=s.chat_template_kwargs,
            )
            samples.extend(got)
            report.add(part)
    finally:
        store.close()
    data = SftData(selected, samples, report, formats)
    if not samples:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(report.skipped.items())) or "none"
        example = next(iter(report.examples.values()), "")
        raise ConfigError(
            f"select: {len(selected.rollouts)} rollouts selected, but none of their {report.calls} calls "
            f"has an answer the student's template can express (skipped: {skipped})"
            + (f"; e.g. {example}" if example else "")
        )
    return data


class StepPlan:
    """Which sequences each step trains on (see the module docstring)."""

    def __init__(self, samples: list[Sample], *, per_step: int, epochs: int, seed: int) -> None:
        self.samples = samples
        self.per_step = per_step
        self.epochs = epochs
        self.seed = seed
        self.steps_per_epoch = math.ceil(len(samples) / per_step)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def batch(self, step: int) -> list[Sample]:
        """The sequences of step ``step`` (0-based)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.samples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return [self.samples[i] for i in order[k * self.per_step : (k + 1) * self.per_step]]


def export_conversations(config: SftConfig, path: Path) -> dict[str, Any]:
    """Write the selected rollouts' conversations to ``path`` as JSONL (``conversations.write_jsonl``:
    OpenAI messages with ``tool_calls``); independent of any student template."""
    from harnessrl.sft.conversations import (
        NoConversation,
        conversation,
        export_line,
        final_calls,
        leaf_conversations,
        with_recorded_answers,
        write_jsonl,
    )

    store = open_source(config)
    try:
        selected = select_from(store, config)
        lines = []
        unreadable: dict[str, int] = {}
        for rollout in selected.rollouts:
            convs = []
            for call in final_calls(rollout, store.list_calls(rollout.rollout_id)):
                try:
                    convs.append(conversation(call))
                except NoConversation as exc:
                    unreadable[exc.reason] = unreadable.get(exc.reason, 0) + 1
            leaves = leaf_conversations(with_recorded_answers(convs))
            lines.extend(export_line(c, rollout) for c in leaves)
    finally:
        store.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    written = write_jsonl(path, lines)
    return {
        "path": str(path),
        "conversations": written,
        "rollouts": len(selected.rollouts),
        "rollouts_dropped": dict(selected.dropped),
        "calls_unreadable": unreadable,
    }
