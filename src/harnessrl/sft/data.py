"""The training data of an SFT run: the selected rollouts of a store, rendered for the student, and
the order its steps take them in. No torch.

The order is a pure function of the data and ``run.seed`` (``StepPlan``): epoch ``e`` takes the
sequences in a permutation seeded by ``(seed, e)``, ``sequences_per_step`` at a time (the last batch
of an epoch may be smaller). So a resumed run recomputes exactly the batches the interrupted one
would have trained on, provided the sequences are the same; the run's checkpoints keep the selected
rollout IDs, and its ``sft_data.json`` a hash of the sequences (``samples_digest``), to check that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.formats import ModelFormats, resolve_formats
from harnessrl.schemas import Call, Rollout
from harnessrl.sft.config import SftConfig
from harnessrl.sft.conversations import (
    Conversation,
    NoConversation,
    conversation,
    export_line,
    final_calls,
    leaf_conversations,
    with_recorded_answers,
    write_jsonl,
)
from harnessrl.sft.render import RenderReport, rollout_sequences
from harnessrl.sft.select import Selected, Selection, select_rollouts
from harnessrl.store import open_store, sqlite_path
from harnessrl.store.base import Store
from harnessrl.store.damage import CallsUnreadable, read_attempt_calls
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trajectory import Sample

#: The first bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"

log = logging.getLogger(__name__)


def source_field(config: SftConfig) -> str:
    """The config field that names the source store, for messages."""
    return "source.run_dir" if config.source.run_dir is not None else "source.store_url"


def source_file(config: SftConfig) -> Path | None:
    """The SQLite file of the source store (None for a PostgreSQL one)."""
    try:
        path = sqlite_path(config.source.url())
    except ConfigError as exc:
        raise ConfigError(f"{source_field(config)}: {exc}") from exc
    return None if path is None or path == ":memory:" else Path(path)


def open_source(config: SftConfig) -> Store:
    """The store the rollouts are in; ``ConfigError`` naming the field if there is none, or if the
    file there is not a SQLite database (a text file used to end in a ``sqlite3`` traceback; an
    empty one would have been made a store, in the teacher's folder)."""
    source = config.source
    field = source_field(config)
    path = source_file(config)
    if path is not None:
        where = source.run_dir if source.run_dir is not None else source.url()
        if not path.is_file():
            raise ConfigError(f"{field}: no recorded rollouts at {where!r} ({path} does not exist)")
        try:
            with path.open("rb") as f:
                header = f.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise ConfigError(f"{field}: cannot read {path}: {exc.strerror}") from exc
        if header != SQLITE_HEADER:
            raise ConfigError(f"{field}: {path} is not a harnessrl store (not a SQLite database)")
    try:
        return open_store(source.url())
    except (sqlite3.DatabaseError, ConfigError) as exc:  # a damaged file: a right header, bad pages
        raise ConfigError(f"{field}: {source.url()} cannot be read as a harnessrl store: {exc}") from exc


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

    @cached_property
    def samples_sha256(self) -> str:
        return samples_digest(self.samples)

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
            "samples_sha256": self.samples_sha256,
        }


def samples_digest(samples: list[Sample]) -> str:
    """A hash of the rendered sequences, in order (tokens and loss masks): what ``StepPlan`` batches.
    ``--resume`` compares it with the run's (``sft_data.json``): the same rollouts rendered
    differently (another tokenizer, template or renderer) would batch other sequences."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(json.dumps([sample.rollout_id, sample.input_ids, sample.loss_mask]).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def final_attempt_calls(store: Store, selected: Selected) -> Iterator[tuple[Rollout, list[Call]]]:
    """Each selected rollout with its final attempt's recorded calls (all that sft uses: ``final_calls``),
    one rollout at a time. A rollout whose calls cannot be read (a damaged row: the store refuses to
    guess) is left out of ``selected`` as ``calls_unreadable`` once every rollout was read, never a
    traceback: reading every attempt, a damaged row of a retried attempt stopped the whole run."""
    kept: list[Rollout] = []
    for rollout in selected.rollouts:
        try:
            calls = read_attempt_calls(store, rollout.rollout_id, rollout.attempt)
        except CallsUnreadable as exc:  # a store that cannot be reached stops the run instead
            log.warning("sft: rollout %s left out: %s", rollout.rollout_id, exc)
            selected.dropped["calls_unreadable"] += 1
            continue
        kept.append(rollout)
        yield rollout, calls
    selected.rollouts[:] = kept


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
        for rollout, calls in final_attempt_calls(store, selected):
            got, part = rollout_sequences(
                rollout,
                calls,
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


def check_export_path(config: SftConfig, path: Path) -> None:
    """``ConfigError`` naming ``--export-jsonl`` if ``path`` is the source store or one of its
    SQLite side files: the export replaces its file, which destroyed the teacher's recordings."""
    store = source_file(config)
    if store is None:
        return
    target = path.expanduser().resolve()
    for name in (store.name, f"{store.name}-wal", f"{store.name}-shm", f"{store.name}-journal"):
        candidate = store.with_name(name)
        same = candidate.expanduser().resolve() == target
        if not same and candidate.exists() and path.exists():
            same = path.samefile(candidate)  # a hard link too
        if same:
            raise ConfigError(
                f"--export-jsonl: {str(path)!r} is the source store's file ({candidate}); "
                "the export would replace the recorded rollouts: give another path"
            )


def exported_conversations(convs: list[Conversation]) -> tuple[list[Conversation], Counter[str]]:
    """The conversations of one rollout's calls (in order, recorded answers in place) that the export
    writes, and the answers skipped by reason. Training's rules on answers (``render.answer_skip``:
    a truncated or empty answer is never trained on) hold for every assistant turn of a line, as
    chat SFT tools train on all of them: a line ends at the last complete answer before the first
    skipped one, so a call whose answer is skipped is never a line's last turn, and a call that
    continues a skipped answer is left out."""
    from harnessrl.sft.render import answer_skip

    skipped: Counter[str] = Counter()
    keys = [c.keys() for c in convs]
    bad: list[list[bytes]] = []
    kept = []
    for conv, mine in zip(convs, keys, strict=True):
        reason = answer_skip(conv)
        if reason is not None:
            skipped[reason.reason] += 1
            bad.append(mine)
        elif not any(len(mine) > len(b) and mine[: len(b)] == b for b in bad):
            kept.append(conv)
    return leaf_conversations(kept), skipped


def export_conversations(config: SftConfig, path: Path) -> dict[str, Any]:
    """Write the selected rollouts' conversations to ``path`` as JSONL (``conversations.write_jsonl``:
    OpenAI messages with ``tool_calls``); independent of any student template, but without the
    answers training skips whatever the template (``exported_conversations``). Written one rollout at
    a time as it is read: gathered first, every conversation of the store was in memory at once (a
    long agent's lines are its whole history, hundreds of KB each)."""
    check_export_path(config, path)
    store = open_source(config)
    try:
        selected = select_from(store, config)
        unreadable: Counter[str] = Counter()
        skipped: Counter[str] = Counter()

        def lines() -> Iterator[dict[str, Any]]:
            for rollout, calls in final_attempt_calls(store, selected):
                convs = []
                for call in final_calls(rollout, calls):
                    try:
                        convs.append(conversation(call))
                    except NoConversation as exc:
                        unreadable[exc.reason] += 1
                exported, skipped_here = exported_conversations(with_recorded_answers(convs))
                skipped.update(skipped_here)
                yield from (export_line(c, rollout) for c in exported)

        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            written = write_jsonl(path, lines())
        except OSError as exc:  # a folder that cannot be written (read-only, full): named, no traceback
            raise ConfigError(f"--export-jsonl: cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    finally:
        store.close()
    return {
        "path": str(path),
        "conversations": written,
        "rollouts": len(selected.rollouts),
        "rollouts_dropped": dict(selected.dropped),
        "calls_unreadable": dict(unreadable),
        "answers_skipped": dict(skipped),
    }
