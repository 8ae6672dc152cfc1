"""An SFT run: its folder, its config, the loop of ``sft.step`` with checkpoints, resume and metrics.

The folder works like a ``harnessrl train`` run folder (``trainer.run_setup``): a new run saves its
resolved config as ``config.json`` (refusing a folder that is not empty), ``--resume`` reads it back
with ``--set`` overrides merged on top (``sft.epochs`` raised to train longer) and, once the policy
and its checkpoint loaded, writes the merged config back (refusing a change of the fields that define
the run, ``SFT_RUN_DEFINING_FIELDS``, and of the rendered sequences, by hash); the CLI holds the folder's lock
(``run_setup.RunFolder``) for the run's life. Checkpoints are
``train``'s (``trainer.checkpoint``): ``checkpoints/latest`` holds the Hugging Face weights, the
tokenizer and chat template, the optimizer and LR schedule, and ``TrainState`` (its
``consumed_groups`` are the selected rollout IDs, checked on resume); at the last step
``checkpoints/final`` (weights and tokenizer only) is written as ``train`` writes it, and ``harnessrl
train`` starts from it with ``engine.model = "RUN_DIR/checkpoints/final"``. The folder's own
``harnessrl.db`` holds the run (its config and status, no rollouts), so ``harnessrl dashboard
--run-dir`` charts it like a train run. ``sft_data.json`` records what was selected,
rendered and skipped; ``metrics.jsonl`` one row per step (``sft/*``, docs/sft.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harnessrl.config import check_cuda_device, device_problem, load_raw_config, validate_config
from harnessrl.errors import ConfigError
from harnessrl.sft.config import SftConfig
from harnessrl.store import open_store
from harnessrl.trainer.run_setup import (
    check_metrics,
    check_no_run_dir,
    check_seed,
    check_unchanged,
    new_run_dir,
    read_saved_config,
    run_folder,
)

CONFIG_FILE = "config.json"
DATA_FILE = "sft_data.json"


#: What an SFT run *is*: a ``--resume`` that changed its name, its student or its LoRA section
#: would continue one run's checkpoint as another's; one that changed what the sequences are
#: (``max_sequence_tokens``, the template's variables, the parsers) or how the steps take them
#: (``run.seed``, ``sequences_per_step``) would, mid-epoch, train some sequences twice and others
#: never. (A changed selection is refused by ``SftRun.run``, by rollout ID, and any other change of
#: the rendered sequences by their hash.) ``sft.epochs`` may change: it only adds or drops whole
#: epochs at the end.
SFT_RUN_DEFINING_FIELDS = (
    "run.name",
    "run.seed",
    "sft.model",
    "sft.lora",
    "sft.sequences_per_step",
    "sft.max_sequence_tokens",
    "sft.chat_template_kwargs",
    "sft.tool_call_parser",
    "sft.reasoning_parser",
)


def prepare_sft_run(
    config_path: str | None, resume: str | None, overrides: list[str], *, export: bool = False
) -> tuple[SftConfig, Path]:
    """``(config, run_dir)`` for a new run from ``config_path`` or a resumed one from ``resume``.
    ``export``: for ``--export-jsonl``, which writes no run folder, so an existing one is no reason
    to refuse. Imports no torch (unless the config names a CUDA device): the CLI checks the config
    before paying for that. A resumed run's merged config is written back by ``SftRun.run``."""
    if resume:
        run_dir = Path(resume)
        raw = read_saved_config(run_dir, "harnessrl sft run folder")
        saved = validate_config(SftConfig, json.loads(json.dumps(raw)))
        changes = load_raw_config(None, overrides, env={})
        check_no_run_dir(changes, run_dir)  # as train's: it was saved into RUN_DIR's config.json
        _merge(raw, changes)
        config = validate_config(SftConfig, raw)
        check_unchanged(saved, config, SFT_RUN_DEFINING_FIELDS)
        sft_preflight(config)
        return config, run_dir
    if config_path is None:
        raise ConfigError("give a config file (harnessrl sft CONFIG) or --resume RUN_DIR")
    base_dir = Path(config_path).resolve().parent
    raw = load_raw_config(config_path, overrides)
    source = raw.get("source")
    if isinstance(source, dict):  # relative to the config file, as train's paths are
        for key in ("run_dir", "store_url"):
            value = source.get(key)
            if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
                source[key] = str((base_dir / value).resolve())
    config = validate_config(SftConfig, raw)
    run_dir = run_folder(config.run.dir, config.run.name, base_dir)
    if export:
        return config, run_dir
    sft_preflight(config)
    return config, new_run_dir(run_dir)


def sft_preflight(config: SftConfig) -> None:
    """What would fail the run after its folder and model exist, checked before: the seed, the
    device, the parser names and the metrics integrations asked for (as ``harnessrl train`` checks
    them)."""
    check_seed(config.run.seed, "run.seed")
    check_finite(config)
    check_parser_names(config)
    problem = device_problem(config.sft.device, auto=True)
    if problem:
        raise ConfigError(f"sft.device: {problem}")
    check_cuda_device(config.sft.device, "sft.device")
    check_metrics(config.metrics)


def check_finite(config: SftConfig) -> None:
    """Every number of the config is finite (``optimizer.lr = inf`` or ``betas = [nan, 0.9]`` passed
    their sections' bounds and made every weight nan at the first step). Not checked: the template's
    own variables (``sft.chat_template_kwargs``) and ``optimizer.grad_clip``, where ``inf`` is how a
    TOML file turns clipping off (nan is refused by its bound)."""

    def walk(value: Any, where: str) -> None:
        if where in _NOT_CHECKED_FINITE:
            return
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {value} is not a finite number")
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}" if where else str(key))
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item, where)

    walk(config.model_dump(), "")


_NOT_CHECKED_FINITE = frozenset({"sft.chat_template_kwargs", "optimizer.grad_clip"})


def check_parser_names(config: SftConfig) -> None:
    """``sft.tool_call_parser`` and ``sft.reasoning_parser`` name known parsers (or ``auto``); the
    gateway's own message names its ``gateway.*`` fields, so the name is put right here."""
    from harnessrl.gateway.parsers.reasoning import get_reasoning_parser
    from harnessrl.gateway.parsers.tools import get_tool_parser

    for field, name, lookup in (
        ("tool_call_parser", config.sft.tool_call_parser, get_tool_parser),
        ("reasoning_parser", config.sft.reasoning_parser, get_reasoning_parser),
    ):
        if name == "auto":
            continue
        try:
            lookup(name)
        except ConfigError as exc:
            raise ConfigError(f"sft.{field}: {str(exc).split(': ', 1)[-1]}") from exc


def save_config(config: SftConfig, run_dir: Path) -> None:
    """``config.json``, replaced whole (never half-written)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = run_dir / f"{CONFIG_FILE}.partial"
    partial.write_text(json.dumps(config.model_dump(mode="json"), indent=2))
    partial.replace(run_dir / CONFIG_FILE)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


class SftRun:
    """One SFT run in ``run_dir``. ``stop_after``: end after that many steps of this process (the
    seam the resume test interrupts a run with; a real run ends at its last step or a signal)."""

    def __init__(
        self, config: SftConfig, run_dir: Path, *, resume: bool = False, stop_after: int | None = None
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.stop_after = stop_after
        #: Whether the step loop began: a failure before it is a failed start-up (the CLI removes a
        #: new run's folder then, so the fixed command is not refused as "already exists").
        self.started = False

    def run(self) -> dict[str, Any]:
        from harnessrl.sft.data import StepPlan, load_data
        from harnessrl.trainer.checkpoint import (
            STATE_FILE,
            TrainState,
            latest_checkpoint,
            repair_numbered,
            write_checkpoint,
        )
        from harnessrl.trainer.metrics import MetricsWriter, clean_row

        cfg, s = self.config, self.config.sft
        student = student_dir(s.model, s.cache_dir)
        data = load_data(cfg, student)  # before anything is written: a bad selection leaves nothing
        checkpoint = latest_checkpoint(self.run_dir) if self.resume else None
        state = TrainState(consumed_groups=data.rollout_ids)
        if checkpoint is not None:
            state = TrainState.from_json((checkpoint / STATE_FILE).read_text())
            if sorted(state.consumed_groups) != sorted(data.rollout_ids):
                raise ConfigError(
                    f"--resume {self.run_dir}: the selection changed since the run started "
                    f"({len(state.consumed_groups)} rollouts then, {len(data.rollout_ids)} now); "
                    "start a new run to train on the new selection"
                )
        if self.resume:
            self._check_same_sequences(data.samples_sha256)
        plan = StepPlan(data.samples, per_step=s.sequences_per_step, epochs=s.epochs, seed=cfg.run.seed)
        final = self.run_dir / "checkpoints" / "final"
        if state.step >= plan.total_steps and _final_step(final) == state.step:
            # A kill during the last step's numbered copy: no checkpoint is written from here on that
            # would copy it again (``write_checkpoint`` does), so it is repaired now.
            repair_numbered(self.run_dir, s.save_every)
            self._save(data)
            return self._summary(state.step, plan.total_steps, data, already_finished=True)
        # (a run stopped between its last step's checkpoint and the final one loads it to write that)

        from harnessrl.sft.step import sft_step
        from harnessrl.trainer.policy import TrainablePolicy

        model_dir, adapter = checkpoint or student, None
        if s.lora is not None:
            from harnessrl.trainer.lora import ADAPTER_DIR, check_lora_dir

            check_lora_dir(student, s.lora, "sft.lora")
            if checkpoint is not None:  # LoRA resumes the checkpoint's adapter on the student's base weights
                model_dir, adapter = student, checkpoint / ADAPTER_DIR
        policy = TrainablePolicy(model_dir, cfg.policy_config(plan.total_steps), adapter_dir=adapter)
        if checkpoint is not None:
            policy.load_trainer_state(checkpoint)
        # Only now that the policy and its state loaded: a --resume whose overrides fail to load
        # leaves the run's config as it was, so a plain --resume still continues it.
        self._save(data)
        metrics = MetricsWriter(
            self.run_dir,
            tensorboard=cfg.metrics.tensorboard,
            wandb_project=cfg.metrics.wandb_project,
            run_name=cfg.run.name,
            progress=cfg.metrics.progress,
            total_steps=plan.total_steps,
            start_step=state.step,
        )
        # A resumed run's metrics file ends at its checkpoint's step: a row a kill cut short goes, and
        # the row of a step whose checkpoint was whole before the kill, but whose row was not yet
        # written, is written from the checkpoint (``TrainState.row``), as ``train`` does.
        metrics.drop_after(state.step)
        if state.step > 0 and state.row is not None and not metrics.has_row(state.step):
            metrics.write(state.step, state.row)
            metrics.progress(state.step, state.row)
        # The run's own store, so `harnessrl dashboard --run-dir` shows (and overlays with RL runs) its
        # metrics as it does a train run's; SFT creates no rollouts.
        store = open_store(str(self.run_dir / "harnessrl.db"))
        store.create_run(cfg.run.name, cfg.model_dump(mode="json"))
        store.set_run_status(cfg.run.name, "running")
        status = "stopped"
        done_here = 0
        self.started = True
        try:
            while state.step < plan.total_steps:
                if self.stop_after is not None and done_here >= self.stop_after:
                    break
                row = sft_step(
                    policy.learner, plan.batch(state.step), micro_batch_tokens=s.micro_batch_tokens
                )
                state.step += 1
                done_here += 1
                row["sft/epoch"] = (state.step - 1) // plan.steps_per_epoch
                state.row = clean_row(row)  # in the checkpoint too: a kill before the row loses nothing
                write_checkpoint(policy, state, self.run_dir, save_every=s.save_every)
                metrics.write(state.step, row)
                metrics.progress(state.step, row)
            if state.step >= plan.total_steps:  # as train ends: weights only, what the next stage loads
                policy.save_checkpoint(final, with_optimizer=False)
                (final / "harnessrl_final.json").write_text(json.dumps({"step": state.step}) + "\n")
                status = "finished"
        finally:
            metrics.close()
            store.set_run_status(cfg.run.name, status)
            store.close()
        return self._summary(state.step, plan.total_steps, data)

    def _save(self, data: Any) -> None:
        """A new run's config, or a resumed one's merged with its --set overrides (the next plain
        --resume, the one printed after Ctrl-C, keeps them), and the data report."""
        save_config(self.config, self.run_dir)
        # Replaced whole: a kill in the middle of the write left a half file, and the next --resume
        # then skipped the check of the training sequences without a word (``_check_same_sequences``).
        partial = self.run_dir / f"{DATA_FILE}.partial"
        partial.write_text(json.dumps(data.summary(), indent=2))
        partial.replace(self.run_dir / DATA_FILE)

    def _check_same_sequences(self, digest: str) -> None:
        """``ConfigError`` if the rendered sequences differ from those the run started on (its
        ``sft_data.json``; a run from before the hash was kept is not checked), or if that file is
        there but damaged: read as "no hash", the check was skipped without a word."""
        path = self.run_dir / DATA_FILE
        if not path.exists():
            return
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"--resume {self.run_dir}: {DATA_FILE} cannot be read ({exc}), so the training sequences "
                f"cannot be checked against the run's; remove {path} to resume without that check"
            ) from None
        saved = saved.get("samples_sha256") if isinstance(saved, dict) else None
        if saved is not None and saved != digest:
            raise ConfigError(
                f"--resume {self.run_dir}: the training sequences changed since the run started (the "
                "same rollouts rendered differently: another student tokenizer, chat template or "
                "harnessrl version); the steps would take other sequences than the run's. Start a new run"
            )

    def _summary(self, step: int, total: int, data: Any, *, already_finished: bool = False) -> dict[str, Any]:
        out = {
            "run_dir": str(self.run_dir),
            "steps": step,
            "total_steps": total,
            "checkpoint": str(self.run_dir / "checkpoints" / ("final" if step >= total else "latest")),
            "sequences": len(data.samples),
            "rollouts": len(data.rollout_ids),
            "calls_skipped": dict(data.report.skipped),
        }
        if already_finished:
            out["already_finished"] = True
        return out


def student_dir(model: str, cache_dir: str | None) -> Path:
    """The student's model folder (built or converted if need be); a ``ConfigError`` naming
    ``sft.model``, or ``sft.cache_dir`` where the cache cannot be written (a traceback otherwise)."""
    from harnessrl.engines.models import resolve_model_dir

    try:
        return Path(resolve_model_dir(model, cache_dir))
    except ConfigError as exc:
        raise ConfigError(f"sft.model: {exc}") from exc
    except OSError as exc:
        field = "sft.cache_dir" if cache_dir is not None else "sft.model"
        where = f" {exc.filename}" if exc.filename else ""
        raise ConfigError(
            f"{field}: cannot build the student {model!r}:{where}: {exc.strerror or exc}"
        ) from exc


def _final_step(final: Path) -> int | None:
    """The step ``checkpoints/final`` was written at, or None if there is none."""
    marker = final / "harnessrl_final.json"
    return json.loads(marker.read_text())["step"] if marker.is_file() else None
