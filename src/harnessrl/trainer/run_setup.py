"""The run folder a training run starts from: its validated config, its folder, its base directory.

``open_run`` is shared by the two entry points that start a run, ``harnessrl train`` (``cli.train``)
and ``torchrun -m harnessrl.trainer.torchrun``, which both hold the folder for the run's life (so
the trainer never imports the CLI); ``prepare_run`` is ``open_run`` with the folder released. It
imports no torch unless the config asks for CUDA or LoRA: the CLI validates the config before paying
for that import.

Everything a config can get wrong is checked before the folder exists (``preflight``, the tasks of
both sources, the weights): a bad config leaves nothing behind, and the fixed command is a new run,
not "already exists". A new run saves its resolved config as ``config.json`` in its folder (with
``_base_dir``, the folder relative paths in the original file were resolved against); ``--resume``
reads it back with ``--set`` overrides merged on top (e.g. ``trainer.steps`` raised to train
longer) and writes the merged config back, so the next plain ``--resume`` keeps them. The fields
that define the run (``RUN_DEFINING_FIELDS``) cannot change on ``--resume``.

A run folder is held by one process at a time (``RunFolder``: an exclusive ``flock`` on
``RUN_DIR/.lock`` for the run's whole life), so two processes never train one folder at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from harnessrl.config import (
    check_cuda_device,
    check_output_path,
    device_problem,
    load_raw_config,
    resolve_relative_paths,
    validate_config,
)
from harnessrl.errors import ConfigError

if TYPE_CHECKING:
    from harnessrl.schemas import Task
    from harnessrl.trainer.config import MetricsSection, TrainConfig
    from harnessrl.trainer.task_sources import TaskSource

CONFIG_FILE = "config.json"
LOCK_FILE = ".lock"

#: What a run *is*: its tasks and groups (``run.seed`` orders each epoch's tasks: a changed seed
#: would repeat some and skip others), the weights it started from, where its rollouts live. A
#: ``--resume`` that changed one would mix two runs in one folder and one store.
RUN_DEFINING_FIELDS = (
    "run.name",
    "run.seed",
    "tasks",
    "heldout",
    "trainer.group_size",
    "engine.model",
    "trainer.model",
    "store",
)


class RunFolder:
    """A run folder this process holds: an exclusive ``flock`` on ``RUN_DIR/.lock``, released by
    ``release`` (or leaving the ``with`` block) and by the process's end, however it ends.

    ``discard`` removes what ``create`` made (the folder, and the parents it had to create) for a
    run whose start-up failed; a held ``--resume`` folder is never removed."""

    def __init__(self, path: Path, fd: int, *, created: Path | None, new: bool) -> None:
        self.path = path
        self._fd: int | None = fd
        self._created = created  # the topmost folder this process created (None: it existed)
        self._new = new

    @classmethod
    def hold(cls, path: Path) -> RunFolder:
        """An existing run folder (``--resume``), locked; ``ConfigError`` if another process holds it."""
        return cls(path, _lock(path), created=None, new=False)

    @classmethod
    def create(cls, path: Path) -> RunFolder:
        """A new run's folder (absent or empty: ``new_run_dir`` checked it), created and locked. The
        emptiness is checked again under the lock: another process may have started a run there since."""
        created = next((p for p in (*reversed(path.parents), path) if not p.exists()), None)
        path.mkdir(parents=True, exist_ok=True)
        try:
            folder = cls(path, _lock(path), created=created, new=True)
        except BaseException:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise
        if any(p.name != LOCK_FILE for p in path.iterdir()):
            folder.release()
            raise ConfigError(f"run folder {str(path)!r} already exists; pass --resume {path} to continue it")
        return folder

    def discard(self) -> None:
        """Remove what this process created for a new run (a start-up that failed before the first
        step): the folder and the parents it created, or the contents of a folder that was empty."""
        if not self._new:
            return
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
            return
        for entry in self.path.iterdir():  # it was empty: everything in it is this process's
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _lock(path: Path) -> int:
    # os.open's descriptors are not inherited by the harnesses and servers the run starts.
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only folder, say: the run could not write its checkpoints either
        raise ConfigError(f"run folder {str(path)!r}: cannot create {LOCK_FILE}: {exc.strerror}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"run folder {str(path)!r} is in use by another harnessrl process (it holds {LOCK_FILE} there); "
            "wait for that run to end or stop it"
        ) from None
    return fd


@dataclass
class PreparedRun:
    """A run ready to start: its config, its folder (held: ``folder.release()`` when the run ends),
    the folder its config's relative paths are resolved against, and its tasks, already loaded."""

    config: TrainConfig
    run_dir: Path
    base_dir: Path
    folder: RunFolder
    tasks: list[Task] = field(default_factory=list)
    heldout: list[Task] = field(default_factory=list)


def prepare_run(
    config_path: str | None, resume: str | None, overrides: list[str]
) -> tuple[TrainConfig, Path, Path]:
    """``(config, run_dir, base_dir)``: ``open_run`` without holding the folder afterwards (the
    lock is released on return; ``open_run`` holds it for the run's life)."""
    run = open_run(config_path, resume, overrides)
    run.folder.release()
    return run.config, run.run_dir, run.base_dir


def open_run(config_path: str | None, resume: str | None, overrides: list[str]) -> PreparedRun:
    """A new run from ``config_path`` or a resumed one from ``resume`` (a run folder), checked,
    its folder created (new) and held. A new run refuses a folder that is not empty."""
    from harnessrl.trainer.config import TrainConfig

    if resume:
        run_dir = Path(resume)
        read_saved_config(run_dir, "harnessrl run folder")  # a run folder, before a lock file is put in it
        folder = RunFolder.hold(run_dir)
        try:
            raw = upgrade_saved_config(read_saved_config(run_dir, "harnessrl run folder"))
            base_dir = Path(raw.pop("_base_dir", "."))
            saved = validate_config(TrainConfig, json.loads(json.dumps(raw)))
            # e.g. raise trainer.steps to train longer; a malformed item is refused as for a new run,
            # and ./paths are the config file's, as for a new run (not the resuming shell's folder)
            changes = resolve_relative_paths(load_raw_config(None, overrides, env={}), base_dir)
            check_no_run_dir(changes, run_dir)
            _merge(raw, changes)
            config = validate_config(TrainConfig, raw)
            check_unchanged(saved, config, RUN_DEFINING_FIELDS)
            check_lora_unchanged(saved, config)
            preflight(config)
            tasks, heldout = load_run_tasks(config, base_dir)
            # The merged config: the plain --resume printed after Ctrl-C keeps these overrides.
            write_config(config, base_dir, run_dir)
        except BaseException:
            folder.release()
            raise
        return PreparedRun(config, run_dir, base_dir, folder, tasks, heldout)
    if config_path is None:
        raise ConfigError("give a config file (harnessrl train CONFIG) or --resume RUN_DIR")
    base_dir = Path(config_path).resolve().parent
    raw = resolve_relative_paths(load_raw_config(config_path, overrides), base_dir)
    config = with_absolute_store(validate_config(TrainConfig, raw))
    run_dir = new_run_dir(run_folder(config.run.dir, config.run.name, base_dir))
    # Before the folder exists: a bad config leaves nothing behind.
    check_weights(config)
    preflight(config, run_dir)
    tasks, heldout = load_run_tasks(config, base_dir)
    folder = RunFolder.create(run_dir)
    try:
        write_config(config, base_dir, run_dir)
    except BaseException:
        folder.discard()
        folder.release()
        raise
    return PreparedRun(config, run_dir, base_dir, folder, tasks, heldout)


def with_absolute_store(config: TrainConfig) -> TrainConfig:
    """``config`` with a relative SQLite ``store.url`` made absolute against the working folder (where
    docs/store.md says it is). Saved relative in ``config.json``, a ``--resume`` from another folder
    opened (and created) another, empty store there: the run's rollouts and calls were not found."""
    from harnessrl.store import sqlite_path

    if config.store is None:
        return config
    try:
        path = sqlite_path(config.store.url)
    except ConfigError:  # an unknown scheme: check_store names it as store.url
        return config
    if path is None or path == ":memory:" or os.path.isabs(path):
        return config
    store = config.store.model_copy(update={"url": str(Path(path).absolute())})
    return config.model_copy(update={"store": store})


def write_config(config: TrainConfig, base_dir: Path, run_dir: Path) -> None:
    """``config.json``: the resolved config and ``_base_dir``, replaced whole (never half-written)."""
    saved = config.model_dump(mode="json")
    saved["_base_dir"] = str(base_dir)
    partial = run_dir / f"{CONFIG_FILE}.partial"
    partial.write_text(json.dumps(saved, indent=2))
    partial.replace(run_dir / CONFIG_FILE)


def run_folder(run_dir: str | None, name: str, base_dir: Path) -> Path:
    """A new run's folder: ``run.dir``, else ``runs/<run.name>`` next to the config file (``base_dir``),
    not the working directory, so the same command from anywhere finds (and refuses to overwrite)
    the same folder. An empty ``run.dir`` is refused, as ``--run-dir ""`` is: it used the default
    folder without a word (``harnessrl train`` and ``harnessrl sft`` alike)."""
    if run_dir == "":
        raise ConfigError(
            "run.dir is empty: give the run folder, or leave run.dir out for runs/<run.name> beside "
            "the config file"
        )
    return Path(run_dir) if run_dir else base_dir / "runs" / name


def check_no_run_dir(changes: dict[str, Any], run_dir: Path) -> None:
    """A ``--resume``'s ``--set`` may not name ``run.dir``: the run folder is ``RUN_DIR``. Merged, it
    was saved into RUN_DIR's ``config.json`` without a word (as ``--run-dir`` with ``--resume`` is
    refused), and the run's config then named another folder than the one it lives in."""
    run = changes.get("run")
    if isinstance(run, dict) and "dir" in run:
        raise ConfigError(
            f"run.dir: cannot be set on --resume: the run folder is the one resumed ({str(run_dir)!r}); "
            "to train in another folder, start a new run"
        )


def check_unchanged(saved: Any, merged: Any, fields: tuple[str, ...]) -> None:
    """``ConfigError`` naming the first of ``fields`` (dotted paths) whose value a ``--resume``
    changed, down to the leaf that differs (``tasks.path``)."""
    before, after = saved.model_dump(mode="json"), merged.model_dump(mode="json")
    for dotted in fields:
        old, new = _at(before, dotted), _at(after, dotted)
        if old != new:
            where, old, new = _first_difference(dotted, old, new)
            raise ConfigError(
                f"{where}: cannot change on --resume ({json.dumps(old)} in the run, {json.dumps(new)} now): "
                "it defines the run, and a changed value would mix two runs in one folder and store; "
                "start a new run for it"
            )


def check_lora_unchanged(saved: TrainConfig, merged: TrainConfig) -> None:
    """``ConfigError`` naming the field when a ``--resume`` adds or removes ``[trainer.lora]`` or
    changes what its checkpoint's adapter was trained with (``r``, ``alpha``, ``target_modules``;
    ``dropout`` may change). Checked before ``config.json`` is written back: refused later (loading
    the checkpoint), the change stayed saved and every plain ``--resume`` failed on it, and adding
    LoRA to a run without it was a traceback (no adapter to resume)."""
    before, after = saved.trainer.lora, merged.trainer.lora
    if (before is None) != (after is None):
        trained = "the whole model" if before is None else "LoRA adapters"
        raise ConfigError(
            f"trainer.lora: cannot be {'added' if before is None else 'removed'} on --resume (the run "
            f"trains {trained}; its checkpoints hold {'no adapter' if before is None else 'an adapter'}); "
            "start a new run for it"
        )
    if before is None or after is None:
        return
    for name in ("r", "alpha", "target_modules"):
        old, new = getattr(before, name), getattr(after, name)
        if name == "target_modules":
            old, new = sorted(old), sorted(new)
        if old != new:
            raise ConfigError(
                f"trainer.lora.{name}: cannot change on --resume ({json.dumps(old)} in the run, "
                f"{json.dumps(new)} now): the run's adapter was trained with it; start a new run for it"
            )


def _at(data: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _first_difference(where: str, old: Any, new: Any) -> tuple[str, Any, Any]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in (*old, *(k for k in new if k not in old)):
            if old.get(key) != new.get(key):
                return _first_difference(f"{where}.{key}", old.get(key), new.get(key))
    return where, old, new


def load_run_tasks(config: TrainConfig, base_dir: Path) -> tuple[list[Task], list[Task]]:
    """The run's training and held-out tasks (``prompt_template`` applied), loaded before the run
    folder exists: a missing file or a template naming a field no task has is a ``ConfigError``
    naming the section it comes from (``tasks`` or ``heldout``); so is a task the harness cannot
    start on (a field its command names missing, a NUL byte, a ``harness.repo`` folder that is not
    there: ``check_tasks``) or the evaluator cannot
    score (no ``hidden.answer``), which was found only at launch or when scored, its attempts retried
    as infrastructure failures and the task never trained."""
    from harnessrl.controller.harness import check_tasks
    from harnessrl.controller.presets import apply_preset

    tasks = _load_source(config.tasks, "tasks", "train", base_dir)
    heldout = _load_source(config.heldout, "heldout", "heldout", base_dir) if config.heldout else []
    harness = apply_preset(config.harness)
    for section, loaded in (("tasks", tasks), ("heldout", heldout)):
        try:
            check_tasks(
                harness,
                ((task.task_id, task.data) for task in loaded),
                config.evaluator,
                # external controllers copy harness.repo on their machines, not this one
                repo_here=config.trainer.controllers == "local",
            )
        except ConfigError as exc:
            raise ConfigError(f"{section}: {exc}") from exc
    return tasks, heldout


def _load_source(source: TaskSource, section: str, split: str, base_dir: Path) -> list[Task]:
    try:
        return source.load(split=split, base_dir=base_dir)
    except ConfigError as exc:
        raise ConfigError(_in_section(str(exc), section, split)) from exc


def _in_section(message: str, section: str, split: str) -> str:
    """A task loader's message, named by the config section: the loaders say "tasks:" for every
    source and "train." for the training split's ``prompt_template``."""
    if message.startswith((f"{section}:", f"{section}.")):
        return message
    for prefix, named in (
        (f"{split}.", f"{section}."),
        (f"{split} tasks: ", f"{section}: "),
        ("tasks: ", f"{section}: "),
    ):
        if message.startswith(prefix):
            return named + message.removeprefix(prefix)
    return f"{section}: {message}"


def read_saved_config(run_dir: Path, what: str) -> dict[str, Any]:
    """The ``config.json`` a run saved in ``run_dir`` (``--resume``); ``what`` names the kind of
    folder expected in the message when it is missing or unreadable."""
    saved = run_dir / CONFIG_FILE
    if not saved.is_file():
        raise ConfigError(f"--resume {str(run_dir)!r}: no {CONFIG_FILE} there; is it a {what}?")
    try:
        raw = json.loads(saved.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--resume {str(run_dir)!r}: {saved} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"--resume {str(run_dir)!r}: {saved} does not hold a JSON object")
    return raw


def new_run_dir(run_dir: Path) -> Path:
    """``run_dir`` made absolute, with ``..`` resolved (so ``nothere/../existing`` is refused as
    ``existing`` is), checked to be free for a new run: absent, or an empty folder. Shared with
    ``harnessrl sft`` (``sft.run``)."""
    run_dir = run_dir.expanduser().resolve()
    check_output_path(run_dir, "run.dir", kind="folder")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(
            f"run folder {str(run_dir)!r} already exists; pass --resume {run_dir} to continue it, "
            "or set run.name / run.dir to start a new run"
        )
    return run_dir


def check_weights(config: TrainConfig) -> None:
    """The weights a new run starts from exist (``engine.model``, or ``trainer.model`` with remote
    servers), found without loading or building them: a typo fails here, not after the run folder
    and the store were created."""
    from harnessrl.config import REMOTE_KINDS
    from harnessrl.engines.models import check_model

    if config.engine.source.kind in REMOTE_KINDS:
        if config.trainer.model is not None:  # TrainConfig requires it with a remote engine
            check_model(config.trainer.model, field="trainer.model")
    elif config.engine.source.kind == "embedded":
        check_model(config.engine.model, field="engine.model")


def preflight(
    config: TrainConfig,
    run_dir: Path | None = None,
    *,
    memory_available: Callable[[], int | None] | None = None,
) -> None:
    """What would fail every rollout, or the run after it started, checked before anything is
    created: the seed and the devices (``check_devices``), the memory the run needs against what the
    machine has (``memory_budget.check_memory``; ``memory_available()`` in bytes, by default
    ``MemAvailable``; None skips the check), the optional integrations the config asks for
    (``check_metrics``), the store (``check_store``), the LoRA section against the model, the
    harness's executable and script (``check_harness``), the sandbox, the evaluator, and the
    gateway's parser names and port (free now). Each problem is a ``ConfigError`` naming the field.

    Skipped for the harness when the trainer's controllers run elsewhere (``trainer.controllers =
    "external"``): their machines, not this one, must have the harness."""
    from harnessrl.config import REMOTE_KINDS
    from harnessrl.trainer.memory_budget import available_memory, check_memory

    check_seed(config.run.seed, "run.seed")
    problem = device_problem(config.trainer.device, auto=True)
    if problem:
        raise ConfigError(f"trainer.device: {problem}")
    check_cuda_device(config.trainer.device, "trainer.device")
    if config.engine.source.kind == "embedded":
        check_cuda_device(config.engine.device, "engine.device")
    check_memory(config, (memory_available or available_memory)())
    check_metrics(config.metrics)
    if config.store is not None:
        from harnessrl.controller.stack import check_store

        check_store(config.store.url)
    if config.trainer.lora is not None:
        # The model's layers against [trainer.lora] (built on the meta device: no weights read).
        from harnessrl.engines.models import resolve_model_dir
        from harnessrl.trainer.lora import check_lora_dir

        remote = config.engine.source.kind in REMOTE_KINDS
        source = config.trainer.model if remote else config.engine.model
        if source is not None:
            check_lora_dir(resolve_model_dir(source, config.engine.cache_dir), config.trainer.lora)
    if not config.trainer.gateway_url:
        from harnessrl.gateway.inputs import check_parsers

        check_parsers(config.gateway)
        # The gateway this process serves binds its port after the model loads and the store
        # opens; a busy port found then would leave a run folder behind.
        from harnessrl.gateway.process import bind_socket

        bind_socket(config.gateway.host, config.gateway.port, listen=False).close()
        if config.retrieval is not None:  # the retriever this gateway serves, built after the model loads
            check_corpus_file(config.retrieval.corpus)
    if config.trainer.controllers == "external":
        return
    from harnessrl.controller.stack import RolloutConfig, check_local_launch, prepare

    prepare(
        RolloutConfig(
            harness=config.harness,
            evaluator=config.evaluator,
            controller=config.controller,
            retrieval=config.retrieval,
            store=config.store,  # its file may not be mounted either (it was checked only for rollout)
        ),
        run_dir,
    )
    # The port of the gateway this process starts, which the harnesses' relay serves (with
    # trainer.gateway_url the controllers are external: returned above).
    check_local_launch(config, None, "gateway.port")


def check_corpus_file(corpus: str) -> None:
    """``retrieval.corpus`` is a file here (its index is built, or read from the cache, only after
    the model loaded and the run folder was made: a typo was found then)."""
    path = Path(corpus)
    if not path.exists():
        raise ConfigError(f"retrieval.corpus: {corpus!r} does not exist")
    if not path.is_file():
        raise ConfigError(f"retrieval.corpus: {corpus!r} is not a file (a JSONL corpus, one passage a line)")


def check_seed(seed: int, field: str) -> None:
    """A seed ``torch.manual_seed`` takes (a 64-bit integer, -1 included): a larger one used to end
    the run in a traceback after its folder and store were created."""
    if not -(2**63) <= seed < 2**64:
        raise ConfigError(
            f"{field}: {seed} is out of range (a seed is a 64-bit integer: -2**63 <= seed < 2**64)"
        )


def check_metrics(metrics: MetricsSection) -> None:
    """The optional metrics integrations a config asks for are installed (``train`` and ``sft``)."""
    import importlib.util

    if metrics.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ConfigError("metrics.wandb_project: wandb is not installed (pip install wandb), or unset it")
    # TensorBoard is on by default and optional (metrics.jsonl has everything): refused only when a
    # config asks for it by name.
    asked_for_tensorboard = "tensorboard" in metrics.model_fields_set and metrics.tensorboard
    if asked_for_tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "metrics.tensorboard: tensorboard is not installed (pip install 'harnessrl[train]'), or set it false"
        )


def upgrade_saved_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A ``config.json`` saved by an older harnessrl, in today's schema. A run folder saves every
    field with its value then, so fields that were removed (they had no effect) are dropped here, or
    ``--resume`` of an older run would be refused:

    - ``trainer.rollout_timeout_s`` was never read;
    - ``algorithm.tis_cap`` without ``algorithm.proximal`` never applied in the native trainer (its
      old default 2.0 was saved in every run); it applies only with ``proximal = "trainer"`` now.
    """
    trainer = raw.get("trainer")
    if isinstance(trainer, dict):
        trainer.pop("rollout_timeout_s", None)
    algorithm = raw.get("algorithm")
    if isinstance(algorithm, dict) and "proximal" not in algorithm:
        algorithm.pop("tis_cap", None)
    return raw


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
