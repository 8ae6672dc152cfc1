"""``Trainer``: one training run, set up around the loop (``loop.TrainingLoop``) and torn down.

It loads the tasks, builds the policy (from ``trainer.model``/``engine.model``, or the checkpoint a
``--resume`` continues), opens the store and the fleet (a gateway this process serves, or gateways
started elsewhere with ``trainer.gateway_url``), reopens what a dead process left behind, publishes a
resumed checkpoint and checks that remote servers serve the trainer's weights before any rollout
starts; then runs the loop, and on every way out (also Ctrl-C / SIGTERM) stops the harnesses,
requeues what was in flight, finishes the checkpoint being written and records the run's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harnessrl.config import REMOTE_KINDS
from harnessrl.controller.presets import apply_preset
from harnessrl.controller.stack import RolloutConfig, check_environments
from harnessrl.environments.stopping import in_thread_stoppably
from harnessrl.schemas import Task
from harnessrl.store import open_store
from harnessrl.trainer.base import Policy
from harnessrl.trainer.checkpoint import STATE_FILE, Checkpointer, TrainState, latest_checkpoint
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.fleet import Fleet, RolloutBook
from harnessrl.trainer.fleet_gateway import served_weights_check
from harnessrl.trainer.fleet_local import local_fleet
from harnessrl.trainer.fleet_remote import remote_fleet
from harnessrl.trainer.loop import TrainingLoop
from harnessrl.trainer.lora import ADAPTER_DIR
from harnessrl.trainer.metrics import MetricsWriter
from harnessrl.trainer.run_setup import load_run_tasks
from harnessrl.trainer.schedule import GroupPlan, TaskSchedule, heldout_overlap, run_id_prefix, train_sampling


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        base_dir: Path | None = None,
        policy_factory: Callable[[Path, Path, Path | None], Policy] | None = None,
        tasks: list[Task] | None = None,
        heldout: list[Task] | None = None,
    ):
        """``tasks``/``heldout``: the sources' tasks when the caller loaded them already (``open_run``
        does, before the run folder exists); else they are loaded here."""
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.base_dir = base_dir or Path.cwd()
        # torchrun: rank 0's handle on a policy sharded over all ranks (trainer/distributed.py).
        self.policy_factory = policy_factory
        t = config.trainer
        if tasks is None:
            tasks, heldout = load_run_tasks(config, self.base_dir)
        self.tasks = tasks
        self.heldout = heldout or []
        self.heldout_overlap = heldout_overlap(self.tasks, self.heldout)
        # Rollout ids start with the run's name (a store may hold many runs); ``run`` keeps the bare
        # ids of a resumed run created before they did (``RolloutBook.rollout_id_prefix``).
        self.schedule = TaskSchedule(
            self.tasks,
            t.group_size,
            config.run.seed,
            train_sampling(t),
            id_prefix=run_id_prefix(config.run.name),
        )
        self.state = TrainState()
        #: Whether the training loop began: a failure before it is a failed start-up (the CLI removes
        #: the folder of a new run then, so the fixed command is not refused as "already exists").
        self.started = False
        self.checkpoint = latest_checkpoint(run_dir) if resume else None
        if self.checkpoint is not None:
            self.state = TrainState.from_json((self.checkpoint / STATE_FILE).read_text())

    # -- setup ---------------------------------------------------------------------------------------
    @functools.cached_property
    def _configured_weights(self) -> Path:
        """The weights the run starts from (built or converted if need be); also the KL reference."""
        from harnessrl.engines.models import resolve_model_dir

        remote = self.config.engine.source.kind in REMOTE_KINDS
        source = self.config.trainer.model if remote else self.config.engine.model
        return Path(resolve_model_dir(source, self.config.engine.cache_dir))

    def _starting_weights(self) -> Path:
        """The checkpoint being resumed, else the configured weights."""
        return self.checkpoint if self.checkpoint is not None else self._configured_weights

    def _build_policy(self) -> Policy:
        from harnessrl.trainer.policy import TrainablePolicy

        model_dir, adapter = self._starting_weights(), None
        if self.config.trainer.lora is not None and self.checkpoint is not None:
            # LoRA resumes the checkpoint's adapter on the run's base weights (trainer/lora.py).
            model_dir, adapter = self._configured_weights, self.checkpoint / ADAPTER_DIR
        # A resumed run keeps its KL anchor: the weights the run started from, not the checkpoint.
        reference = self._configured_weights if self.config.algorithm.kl_coef > 0 else model_dir
        policy: Policy
        if self.policy_factory is not None:
            policy = self.policy_factory(model_dir, reference, adapter)
        else:
            policy = TrainablePolicy.from_config(
                self.config, model_dir, reference_dir=reference, adapter_dir=adapter
            )
        if self.checkpoint is not None and (self.checkpoint / "trainer_state.pt").exists():
            policy.load_trainer_state(self.checkpoint)
        return policy

    def _rollout_config(self) -> RolloutConfig:
        cfg = self.config
        engine = cfg.engine
        if engine.source.kind == "embedded":  # it serves the trainer's own starting weights
            engine = engine.model_copy(update={"model": str(self._starting_weights())})
        return RolloutConfig(
            engine=engine,
            gateway=cfg.gateway,
            harness=cfg.harness,
            evaluator=cfg.evaluator,
            controller=cfg.controller,
            retrieval=cfg.retrieval,
        )

    # -- the run -------------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        cfg = self.config
        if cfg.trainer.lora is not None:  # a bad [trainer.lora] fails before anything starts
            from harnessrl.trainer.lora import check_lora_dir

            await asyncio.to_thread(check_lora_dir, self._configured_weights, cfg.trainer.lora)
        if cfg.harness.environment is not None and cfg.trainer.controllers != "external":
            # Each task's image (docs/environments.md), built and checked to run the harness before
            # anything of the run starts: a missing image is one clear error, not a run of failures.
            tasks = [t.data for t in (*self.tasks, *self.heldout)]
            # A stop (Ctrl-C, SIGTERM) kills the build: asyncio's shutdown would wait for it.
            await in_thread_stoppably(check_environments, apply_preset(cfg.harness), list(tasks))
        policy = self._build_policy()
        checkpointer = Checkpointer(
            policy, self.run_dir, save_every=cfg.trainer.save_every, background=self.policy_factory is None
        )
        metrics = MetricsWriter(
            self.run_dir,
            tensorboard=cfg.metrics.tensorboard,
            wandb_project=cfg.metrics.wandb_project,
            run_name=cfg.run.name,
            progress=cfg.metrics.progress,
            total_steps=cfg.trainer.steps,
            start_step=self.state.step,
        )
        if self.heldout_overlap:
            # Held-out accuracy on problems the policy trained on overstates generalization.
            metrics.message(
                f"warning: {self.heldout_overlap} held-out tasks also appear among the training tasks"
            )
        started = time.monotonic()
        # [store] url (e.g. a shared PostgreSQL, docs/scale.md) or the run folder's own SQLite file
        store_url = cfg.store.url if cfg.store is not None else str(self.run_dir / "harnessrl.db")
        store = open_store(store_url)
        external = cfg.trainer.controllers == "external"
        book = RolloutBook(
            store, cfg.run.name, poll_s=0.5 if external else 2.0, deadline_s=cfg.rollout_deadline_s()
        )
        created = finished = False
        try:
            async with self._open_fleet(book, store_url, metrics.message) as (fleet, start_controllers):
                await asyncio.to_thread(store.create_run, cfg.run.name, cfg.model_dump(mode="json"))
                created = True
                await asyncio.to_thread(store.set_run_status, cfg.run.name, "running")
                self.schedule.id_prefix = await asyncio.to_thread(book.rollout_id_prefix)
                groups_created = await self._reopen(fleet)
                if self.state.step > 0:  # the engine serves the starting weights: give it the checkpoint's
                    await fleet.publish(self.state.step, policy, restore=True)
                elif cfg.trainer.lora is not None and cfg.engine.source.kind in REMOTE_KINDS:
                    # The servers load the fresh adapter (the base model's function) before any
                    # rollout: one that cannot load adapters fails here, not after the first step.
                    await fleet.publish(0, policy)
                if cfg.trainer.served_weights_tolerance:
                    await fleet.check_served_weights(
                        served_weights_check(policy, cfg.trainer, metrics.message)
                    )
                start_controllers()
                loop = TrainingLoop(
                    cfg,
                    fleet,
                    policy,
                    self.schedule,
                    self.state,
                    checkpointer,
                    metrics,
                    heldout=self.heldout,
                    heldout_overlap=self.heldout_overlap,
                    groups_created=groups_created,
                )
                self.started = True
                try:
                    await loop.run()
                finally:
                    await checkpointer.written()
                await asyncio.to_thread(store.set_run_status, cfg.run.name, "finished")
                finished = True
        finally:
            try:
                # The gateway and every harness are gone now (also after Ctrl-C / SIGTERM, which
                # cancel this task), so nothing of this run can still be running.
                book.requeue_running("run ended while it was in flight")
                if created and not finished:
                    store.set_run_status(cfg.run.name, "stopped")
            finally:
                store.close()
                metrics.close()
        # Always rewritten: after --resume the folder holds an earlier run's end, not this one's.
        final = self.run_dir / "checkpoints" / "final"
        policy.save_checkpoint(final, with_optimizer=False)
        (final / "harnessrl_final.json").write_text(json.dumps({"step": self.state.step}) + "\n")
        return {
            "run_dir": str(self.run_dir),
            "steps": self.state.step,
            "minutes": round((time.monotonic() - started) / 60, 2),
            "final_checkpoint": str(final),
        }

    def _open_fleet(
        self, book: RolloutBook, store_url: str, message: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[tuple[Fleet, Callable[[], None]]]:
        """Gateways started elsewhere (``trainer.gateway_url``), or one this process serves (an
        async context manager yielding the fleet and its ``start_controllers``)."""
        cfg = self.config
        common = {"message": message, "store_url": store_url}
        if cfg.trainer.gateway_url:
            return remote_fleet(
                cfg.trainer.gateway_url,
                cfg.gateway.admin_key or "",
                cfg.engine,
                self.run_dir,
                book,
                pause_timeout_s=cfg.gateway.pause_timeout_s,
                **common,
            )
        external = cfg.trainer.controllers == "external"
        return local_fleet(
            self._rollout_config(), self.run_dir, book, external_controllers=external, **common
        )

    async def _reopen(self, fleet: Fleet) -> int:
        """A resumed run: requeue what the dead process left running and reopen the groups it
        created but did not train (the schedule recreates the same plans), except those that failed
        before the policy was sampled (what stopped the run, if a ``StepFailed`` did), and mark the
        rollouts sampled by weights published after the checkpoint (lost with the kill: not
        trained), and the evaluations they ran (redone under new ids). Returns how many groups the
        run has created."""
        consumed = set(self.state.consumed_groups)

        def reopened(created: int) -> list[GroupPlan]:
            plans = [self.schedule.group(i, step=self.state.step) for i in range(created)]
            return [p for p in plans if p.group_id not in consumed]

        created = await fleet.recover(reopened, policy_version=self.state.step)
        self.schedule.redo_evaluations(await fleet.retire_evaluations(self.state.step))
        return created
