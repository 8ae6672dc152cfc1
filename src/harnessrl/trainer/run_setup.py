"""The run folder a training run starts from: its validated config, its folder, its base directory.

``prepare_run`` is shared by the two entry points that start a run, ``harnessrl train``
(``cli.train``) and ``torchrun -m harnessrl.trainer.torchrun``, so the trainer never imports the
CLI. It imports no torch: the CLI validates the config before paying for that import.

A new run saves its resolved config as ``config.json`` in its folder (with ``_base_dir``, the folder
relative paths in the original file were resolved against); ``--resume`` reads it back, with
``--set`` overrides merged on top (e.g. ``trainer.steps`` raised to train longer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harnessrl.config import check_output_path, load_raw_config, resolve_relative_paths, validate_config
from harnessrl.errors import ConfigError

if TYPE_CHECKING:
    from harnessrl.trainer.config import TrainConfig

CONFIG_FILE = "config.json"


def prepare_run(
    config_path: str | None, resume: str | None, overrides: list[str]
) -> tuple[TrainConfig, Path, Path]:
    """``(config, run_dir, base_dir)`` for a new run from ``config_path`` or a resumed one from
    ``resume`` (a run folder). A new run refuses a folder that is not empty."""
    from harnessrl.trainer.config import TrainConfig

    if resume:
        run_dir = Path(resume)
        raw = upgrade_saved_config(read_saved_config(run_dir, "harnessrl run folder"))
        base_dir = Path(raw.pop("_base_dir", "."))
        # e.g. raise trainer.steps to train longer; a malformed item is refused as for a new run
        _merge(raw, load_raw_config(None, overrides, env={}))
        config = validate_config(TrainConfig, raw)
        preflight(config)
        return config, run_dir, base_dir
    if config_path is None:
        raise ConfigError("give a config file (harnessrl train CONFIG) or --resume RUN_DIR")
    base_dir = Path(config_path).resolve().parent
    raw = resolve_relative_paths(load_raw_config(config_path, overrides), base_dir)
    config = validate_config(TrainConfig, raw)
    # Next to the config file, not the working directory: the same command from anywhere finds
    # (and refuses to overwrite) the same folder.
    run_dir = new_run_dir(Path(config.run.dir) if config.run.dir else base_dir / "runs" / config.run.name)
    # Before the folder exists: a bad config leaves nothing behind.
    check_weights(config)
    preflight(config, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = config.model_dump(mode="json")
    saved["_base_dir"] = str(base_dir)
    (run_dir / CONFIG_FILE).write_text(json.dumps(saved, indent=2))
    return config, run_dir, base_dir


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
    created: the memory the run needs against what the machine has (``memory_budget.check_memory``;
    ``memory_available()`` in bytes, by default ``MemAvailable``; None skips the check), the harness's executable
    and script (``check_harness``), the sandbox, the evaluator, the optional integrations the
    config asks for, and the gateway's port (free now). Each problem is a ``ConfigError`` naming the field.

    Skipped for the harness when the trainer's controllers run elsewhere (``trainer.controllers =
    "external"``): their machines, not this one, must have the harness."""
    import importlib.util

    from harnessrl.trainer.memory_budget import available_memory, check_memory

    check_memory(config, (memory_available or available_memory)())

    if config.metrics.wandb_project and importlib.util.find_spec("wandb") is None:
        raise ConfigError("metrics.wandb_project: wandb is not installed (pip install wandb), or unset it")
    # TensorBoard is on by default and optional (metrics.jsonl has everything): refused only when a
    # config asks for it by name.
    asked_for_tensorboard = "tensorboard" in config.metrics.model_fields_set and config.metrics.tensorboard
    if asked_for_tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            "metrics.tensorboard: tensorboard is not installed (pip install 'harnessrl[train]'), or set it false"
        )
    if not config.trainer.gateway_url:
        # The gateway this process serves binds its port after the model loads and the store
        # opens; a busy port found then would leave a run folder behind.
        from harnessrl.gateway.process import bind_socket

        bind_socket(config.gateway.host, config.gateway.port, listen=False).close()
    if config.trainer.controllers == "external":
        return
    from harnessrl.controller.stack import RolloutConfig, prepare

    prepare(
        RolloutConfig(
            harness=config.harness,
            evaluator=config.evaluator,
            controller=config.controller,
            retrieval=config.retrieval,
        ),
        run_dir,
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
