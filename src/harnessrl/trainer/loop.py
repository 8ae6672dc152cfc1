"""The training loop of ``harnessrl train``: rollouts in, policy updates out.

One loop serves both modes. Rollouts are created in *groups* (``group_size`` rollouts of one task)
and consumed by optimizer steps, ``tasks_per_step`` complete groups per step, oldest first:

- ``sync``: the next step's groups are created only after the previous step trained, so every
  step waits for its slowest rollout and no rollout ever sees two policy versions.
- ``async`` (collocated): up to ``max_in_flight`` rollouts stay queued or running while the
  trainer works; a step starts as soon as enough groups are complete. For the step the gateway is
  paused (new model calls wait, in-flight ones finish, harnesses see no error), the trainer
  steps and pushes weights to the engine, and the gateway resumes. A rollout that straddles an
  update carries per-call policy versions; groups more than ``max_staleness`` versions old are
  dropped (or down-weighted).

Crash safety: after a step, the weights, optimizer state and the list of consumed groups are
written together in one checkpoint folder (atomic rename). ``--resume`` reloads it, requeues the
rollouts that were running when the process died (a new attempt each), and goes on: no group is
trained twice and no finished rollout is lost.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.algorithms import assign_advantages, rollout_advantages
from harnessrl.client import check_drained
from harnessrl.controller.stack import RolloutConfig, local_stack
from harnessrl.engines.base import WeightUpdate
from harnessrl.errors import ConfigError, UpstreamError
from harnessrl.schemas import TERMINAL_STATUSES, Outcome, PolicyVersion, Rollout, RolloutStatus
from harnessrl.store import open_store
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.metrics import MetricsWriter
from harnessrl.trainer.schedule import (
    EVAL_KIND,
    TRAIN_KIND,
    GroupPlan,
    TaskSchedule,
    eval_rollout_id,
    load_task_source,
)
from harnessrl.trajectory import build_batch

STATE_FILE = "harnessrl_state.json"
# The served-weights check's prompt: any fixed text the tokenizer can encode.
SERVED_WEIGHTS_PROBE = "The trainer and the engine must agree on every logprob of this sentence."
ACTIVE = (RolloutStatus.QUEUED, RolloutStatus.RUNNING)


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done == policy version
    consumed_groups: list[str] = field(default_factory=list)
    evaluated_steps: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> TrainState:
        return cls(**json.loads(text))


def latest_checkpoint(run_dir: Path) -> Path | None:
    for name in ("latest", "latest.old"):
        folder = run_dir / "checkpoints" / name
        if (folder / STATE_FILE).exists():
            return folder
    return None


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        base_dir: Path | None = None,
        policy_factory: Callable[[Path], Any] | None = None,
    ):
        self.config = config
        # torchrun: rank 0's handle on a policy sharded over all ranks (trainer/distributed.py).
        self.policy_factory = policy_factory
        self._updater: Any = None  # remote engines: the trainer's own client for weight reloads
        self.run_dir = run_dir
        self.resume = resume
        self.base_dir = base_dir or Path.cwd()
        self.run_id = config.run.name
        t = config.trainer
        self.group_size = t.group_size
        self.in_flight_limit = t.max_in_flight or 2 * t.tasks_per_step * t.group_size
        if t.mode == "sync":
            self.in_flight_limit = t.tasks_per_step * t.group_size
        self.state = TrainState()
        self._groups_created = 0
        self._pause_s = 0.0
        # The step's checkpoint being written while the next rollouts generate (one process only:
        # a sharded policy's save is a collective that must run in step with the other ranks).
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._checkpoint_in_background = policy_factory is None

    # -- setup ---------------------------------------------------------------------------------------
    def _load_tasks(self) -> None:
        self.tasks = load_task_source(self.config.tasks, split="train", base_dir=self.base_dir)
        self.heldout = (
            load_task_source(self.config.heldout, split="heldout", base_dir=self.base_dir)
            if self.config.heldout
            else []
        )
        if self.heldout:
            train_q = {t.data.get("question") or t.data.get("prompt") for t in self.tasks}
            overlap = sum(
                1 for t in self.heldout if (t.data.get("question") or t.data.get("prompt")) in train_q
            )
            self.heldout_overlap = overlap
        else:
            self.heldout_overlap = 0
        self.schedule = TaskSchedule(self.tasks, self.group_size, self.config.run.seed)

    def _model_dir(self) -> tuple[Path, Path | None]:
        from harnessrl.engines.models import resolve_model_dir

        checkpoint = latest_checkpoint(self.run_dir) if self.resume else None
        if checkpoint is not None:
            self.state = TrainState.from_json((checkpoint / STATE_FILE).read_text())
            return checkpoint, checkpoint
        source = self.config.trainer.model if self._remote_engine else self.config.engine.model
        return Path(resolve_model_dir(source, self.config.engine.cache_dir)), None

    @property
    def _remote_engine(self) -> bool:
        return self.config.engine.model.startswith(("vllm:", "sglang:"))

    async def _publish_weights(self, version: int) -> None:
        """The policy's weights to the engine: in place (embedded), or as a Hugging Face folder that
        remote servers load (``engine-weights/v<N>``; older versions are removed once loaded)."""
        if not self._remote_engine:
            await self.stack.engine.update_weights(
                WeightUpdate(version=version, state_dict=self.policy.engine_state_dict())
            )
            return
        root = self.run_dir / "engine-weights"
        folder = root / f"v{version}"
        await asyncio.to_thread(self.policy.save_checkpoint, folder, with_optimizer=False)
        updater = await self._remote_client()
        await updater.update_weights(WeightUpdate(version=version, checkpoint_dir=str(folder)))
        await asyncio.to_thread(self._client().resume, policy_version=version)
        for old in root.glob("v*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    async def _remote_client(self) -> Any:
        """The trainer's own client of the remote servers (an ``EnginePool``). The gateway's engine
        object lives on the gateway's event loop; the trainer loads the servers through this one,
        then tells the gateway(s) the new version on resume (the same path as a trainer driving
        several gateways, docs/gateway.md)."""
        if self._updater is None:
            from harnessrl.engines.factory import create_engine

            self._updater = create_engine(self.config.engine)
            await self._updater.start()
        return self._updater

    async def _check_served_weights(self) -> None:
        """Every remote server must serve the weights the trainer holds (``trainer.model``, or the
        checkpoint a ``--resume`` just reloaded), or every sample is silently off-policy: a short probe
        generation per server, its logprobs compared with the trainer's own forward pass."""
        tolerance = self.config.trainer.served_weights_tolerance
        if not tolerance:
            return
        from harnessrl.engines.base import GenerationContext, SamplingParams

        pool = await self._remote_client()
        tokenizer = pool.tokenizer
        prompt = tokenizer.encode(SERVED_WEIGHTS_PROBE)
        params = SamplingParams(max_tokens=16, temperature=1.0)
        context = GenerationContext(stream=False)
        for replica in pool.replicas:
            samples = [s async for s in replica.engine.generate(prompt, params, context)]
            served = [s.logprob for s in samples]
            ours = await asyncio.to_thread(
                self.policy.response_logprobs, prompt, [s.token_id for s in samples]
            )
            gap = statistics.fmean(abs(a - b) for a, b in zip(served, ours, strict=True)) if served else 0.0
            if gap > tolerance:
                raise ConfigError(
                    f"the engine at {replica.name} does not serve the trainer's weights "
                    f"({self.config.trainer.model or 'trainer.model'}): on a probe its logprobs differ from "
                    f"the trainer's by {gap:.3f} nats per token on average (tolerance "
                    f"trainer.served_weights_tolerance = {tolerance}); start the server on the same weights"
                )
            self.metrics.message(
                f"engine at {replica.name} serves the trainer's weights (gap {gap:.4f} nats)"
            )

    # -- the loop ------------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        from harnessrl.trainer.policy import TrainablePolicy

        cfg = self.config
        self._load_tasks()
        model_dir, checkpoint = self._model_dir()
        if self.policy_factory is not None:
            policy = self.policy_factory(model_dir)
        else:
            policy = TrainablePolicy.from_config(cfg, model_dir)
        if checkpoint is not None and (checkpoint / "trainer_state.pt").exists():
            policy.load_trainer_state(checkpoint)
        self.policy = policy
        rollout_cfg = RolloutConfig(
            # embedded: the engine serves the trainer's own starting weights; remote servers are
            # given the trainer's weights after every step (_publish_weights)
            engine=cfg.engine
            if self._remote_engine
            else cfg.engine.model_copy(update={"model": str(model_dir)}),
            gateway=cfg.gateway,
            harness=cfg.harness,
            evaluator=cfg.evaluator,
            controller=cfg.controller,
        )
        self.metrics = MetricsWriter(
            self.run_dir,
            tensorboard=cfg.metrics.tensorboard,
            wandb_project=cfg.metrics.wandb_project,
            run_name=self.run_id,
            progress=cfg.metrics.progress,
        )
        if self.heldout_overlap:
            # Held-out accuracy on problems the policy trained on overstates generalization.
            self.metrics.message(
                f"warning: {self.heldout_overlap} held-out tasks also appear among the training tasks"
            )
        started = time.monotonic()
        # [store] url (e.g. a shared PostgreSQL, docs/scale.md) or the run folder's own SQLite file
        store_url = cfg.store.url if cfg.store is not None else str(self.run_dir / "harnessrl.db")
        store = open_store(store_url)
        created = finished = False
        try:
            async with local_stack(rollout_cfg, self.run_dir, store=store, run_id=self.run_id) as stack:
                self.stack = stack
                self.store = stack.store
                self.store.create_run(self.run_id, cfg.model_dump(mode="json"))
                created = True
                self.store.set_run_status(self.run_id, "running")
                self._recover()
                if self.state.step > 0:  # the engine loaded the checkpoint; give it the right version
                    await self._publish_weights(self.state.step)
                if self._remote_engine:
                    await self._check_served_weights()
                stop = asyncio.Event()
                if cfg.trainer.controllers == "external":
                    self.metrics.message(
                        "waiting for external controllers: harnessrl controller --config CONFIG "
                        f"--store {store_url} --gateway-url {stack.gateway_url}"
                    )
                    controller_task = asyncio.create_task(stop.wait())
                else:
                    controller_task = asyncio.create_task(stack.controller.run_forever(stop))
                try:
                    await self._train_loop()
                finally:
                    await self._checkpoint_written()
                    stop.set()
                    await controller_task
                    if self._updater is not None:
                        await self._updater.aclose()
                self.store.set_run_status(self.run_id, "finished")
                finished = True
        finally:
            try:
                # The gateway and every harness are gone now (also after Ctrl-C / SIGTERM, which
                # cancel this task), so nothing of this run can still be running: requeue what a
                # late call or a cancelled launch left marked running, so the store says what a
                # later --resume will find.
                for rollout in store.list_rollouts(run_id=self.run_id, status=RolloutStatus.RUNNING):
                    store.requeue_rollout(rollout.rollout_id, error="run ended while it was in flight")
                if created and not finished:
                    store.set_run_status(self.run_id, "stopped")
            finally:
                store.close()
                self.metrics.close()
        final = self.run_dir / "checkpoints" / "final"
        if not final.exists():
            policy.save_checkpoint(final, with_optimizer=False)
        return {
            "run_dir": str(self.run_dir),
            "steps": self.state.step,
            "minutes": round((time.monotonic() - started) / 60, 2),
            "final_checkpoint": str(final),
        }

    def _recover(self) -> None:
        """Requeue rollouts a dead process left running; count groups already created."""
        for rollout in self.store.list_rollouts(run_id=self.run_id, status=RolloutStatus.RUNNING):
            self.store.requeue_rollout(rollout.rollout_id, error="trainer restarted")
        groups = {
            r.group_id
            for r in self.store.list_rollouts(run_id=self.run_id)
            if r.metadata.get("kind") == TRAIN_KIND
        }
        self._groups_created = len(groups)

    async def _train_loop(self) -> None:
        cfg = self.config.trainer
        if self.heldout and cfg.eval_every and 0 not in self.state.evaluated_steps and self.state.step == 0:
            await self._evaluate_and_log(0, {})
        last = time.monotonic()
        while self.state.step < cfg.steps:
            groups = await self._wait_for_groups()
            metrics = await self._step(groups, since=last)
            last = time.monotonic()
            step = self.state.step
            if self.heldout and cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
                await self._evaluate_and_log(step, metrics)
            else:
                self.metrics.write(step, metrics)
                self.metrics.progress(step, cfg.steps, metrics)

    async def _evaluate_and_log(self, step: int, metrics: dict[str, Any]) -> None:
        metrics = {**metrics, **await self._evaluate(step)}
        self.state.evaluated_steps.append(step)
        self.metrics.write(step, metrics)
        self.metrics.progress(step, self.config.trainer.steps, metrics)

    # -- feeding -------------------------------------------------------------------------------------
    def _train_rollouts(self) -> list[Rollout]:
        return [
            r for r in self.store.list_rollouts(run_id=self.run_id) if r.metadata.get("kind") == TRAIN_KIND
        ]

    def _feed(self, rollouts: list[Rollout]) -> None:
        cfg = self.config.trainer
        consumed = set(self.state.consumed_groups)
        unconsumed = {r.group_id for r in rollouts if r.group_id not in consumed}
        in_flight = sum(1 for r in rollouts if r.status in ACTIVE)
        # Bound both the work in flight and how far generation runs ahead of training (staleness).
        max_unconsumed = cfg.tasks_per_step * (1 + (cfg.max_staleness if cfg.mode == "async" else 0))
        while in_flight + self.group_size <= self.in_flight_limit and len(unconsumed) < max_unconsumed:
            plan = self.schedule.group(self._groups_created)
            self._create_group(plan)
            self._groups_created += 1
            unconsumed.add(plan.group_id)
            in_flight += self.group_size

    def _create_group(self, plan: GroupPlan) -> None:
        cfg = self.config.trainer
        sampling: dict[str, Any] = {"temperature": cfg.temperature}
        if cfg.top_p != "harness":
            # The trainer's logprobs come from the full tempered softmax; with top_p < 1 the engines
            # record the renormalized nucleus instead (docs/train.md, "What is recorded").
            sampling["top_p"] = cfg.top_p
        if cfg.max_tokens:
            sampling["max_tokens"] = cfg.max_tokens
        for rollout_id in plan.rollout_ids:
            self.store.create_rollout(
                rollout_id=rollout_id,
                task=plan.task.data,
                run_id=self.run_id,
                task_id=plan.task.task_id,
                group_id=plan.group_id,
                step=plan.index,
                metadata={"kind": TRAIN_KIND, "sampling": sampling},
            )

    async def _wait_for_groups(self) -> list[list[Rollout]]:
        cfg = self.config.trainer
        consumed = set(self.state.consumed_groups)
        while True:
            rollouts = await asyncio.to_thread(self._train_rollouts)
            await asyncio.to_thread(self._feed, rollouts)
            by_group: dict[str, list[Rollout]] = {}
            for r in rollouts:
                if r.group_id not in consumed:
                    by_group.setdefault(r.group_id or r.rollout_id, []).append(r)
            complete = [
                members
                for _, members in sorted(by_group.items())
                if len(members) == self.group_size and all(r.status in TERMINAL_STATUSES for r in members)
            ]
            if len(complete) >= cfg.tasks_per_step:
                return complete[: cfg.tasks_per_step]
            await asyncio.sleep(0.2)

    # -- one step ------------------------------------------------------------------------------------
    async def _checkpoint_written(self) -> float:
        """Wait for the previous step's checkpoint write; returns the seconds waited."""
        task, self._checkpoint_task = self._checkpoint_task, None
        if task is None:
            return 0.0
        started = time.monotonic()
        await task
        return time.monotonic() - started

    async def _step(self, groups: list[list[Rollout]], *, since: float) -> dict[str, Any]:
        cfg = self.config
        t0 = time.monotonic()
        # The previous checkpoint must be whole before this step changes the weights it holds.
        checkpoint_wait_s = await self._checkpoint_written()
        rollouts = [r for members in groups for r in members]
        calls = {r.rollout_id: await asyncio.to_thread(self.store.list_calls, r.rollout_id) for r in rollouts}
        version = self.state.step
        staleness: list[int] = []
        kept: list[Rollout] = []
        dropped_stale = 0
        for r in rollouts:
            versions = [c.policy_version for c in calls[r.rollout_id] if c.attempt == r.attempt]
            lag = version - min(versions) if versions else 0
            staleness.append(lag)
            if lag > cfg.trainer.max_staleness and cfg.trainer.stale_samples == "drop":
                dropped_stale += 1
                continue
            kept.append(r)
        batch = build_batch(
            [(r, calls[r.rollout_id]) for r in kept], max_sample_tokens=cfg.trainer.max_sample_tokens
        )
        advantages = rollout_advantages(kept, cfg.algorithm)
        if cfg.trainer.stale_samples == "downweight":
            for r, lag in zip(rollouts, staleness, strict=True):
                if lag > cfg.trainer.max_staleness and r.rollout_id in advantages.advantages:
                    advantages.advantages[r.rollout_id] *= cfg.trainer.max_staleness / lag if lag else 1.0
        samples = assign_advantages(batch.samples, advantages)

        pause_started = time.monotonic()
        async_mode = cfg.trainer.mode == "async"
        client = self._client()
        if async_mode:
            # Returns once in-flight calls have finished, or after the pause timeout.
            paused = await asyncio.to_thread(client.pause)
            try:
                check_drained(paused, client.base_url)
            except UpstreamError:
                await asyncio.to_thread(client.resume)
                raise
        drain_s = time.monotonic() - pause_started
        try:
            train_metrics = await asyncio.to_thread(
                self.policy.train_step,
                samples,
                cfg.algorithm,
                temperature=cfg.trainer.temperature,
                micro_batch_tokens=max(
                    cfg.trainer.micro_batch_tokens, max((len(s) for s in samples), default=0)
                ),
            )
            new_version = version + 1
            await self._publish_weights(new_version)
        finally:
            if async_mode:
                await asyncio.to_thread(client.resume)
        pause_s = time.monotonic() - pause_started

        self.state.step = new_version
        self.state.consumed_groups.extend(members[0].group_id or "" for members in groups)
        self.store.add_policy_version(PolicyVersion(version=new_version, step=new_version))
        for r in rollouts:
            self.store.update_rollout_metadata(r.rollout_id, {"trained_at_step": new_version})
        # Writing ~12 bytes per parameter takes seconds: one process writes it in a thread while
        # the next step's rollouts generate (the next step waits for it before it trains, so the
        # weights cannot change under it). A kill before it is whole resumes from the step before
        # and trains this step again from the same stored rollouts. Ranks of a distributed run
        # write it together (collectives), in step.
        checkpoint = asyncio.create_task(asyncio.to_thread(self._checkpoint))
        if self._checkpoint_in_background:
            self._checkpoint_task = checkpoint
        else:
            await checkpoint

        rewards = [
            r.reward for r in rollouts if r.reward is not None and r.outcome is not Outcome.INFRA_FAILURE
        ]
        generated = sum(len(c.response_token_ids) for cs in calls.values() for c in cs)
        wall = max(1e-9, time.monotonic() - since)
        metrics: dict[str, Any] = {
            "reward/mean": statistics.fmean(rewards) if rewards else None,
            "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "reward/success_rate": sum(1 for x in rewards if x >= 1.0) / len(rewards) if rewards else None,
            "rollouts": len(rollouts),
            "rollouts/infra_failures": sum(1 for r in rollouts if r.outcome is Outcome.INFRA_FAILURE),
            "rollouts/dropped_stale": dropped_stale,
            "staleness/mean": statistics.fmean(staleness) if staleness else 0.0,
            "staleness/max": max(staleness, default=0),
            "throughput/tokens_per_s": generated / wall,
            "time/step_s": wall,
            "time/train_s": time.monotonic() - t0,
            "time/pause_s": pause_s if async_mode else 0.0,
            "time/drain_s": drain_s if async_mode else 0.0,
            "time/checkpoint_wait_s": checkpoint_wait_s,
            "policy_version": new_version,
            **advantages.metrics,
            **batch.stats.as_metrics(prefix="trajectory/"),
            **train_metrics,
        }
        kl = train_metrics.get("loss/approx_kl")
        if kl is not None:
            metrics["kl"] = kl
        return metrics

    def _client(self):
        from harnessrl.client import GatewayClient

        return GatewayClient(self.stack.gateway_url, self.stack.admin_key)

    def _checkpoint(self) -> None:
        """Weights + optimizer + trainer state in one folder, swapped in atomically."""
        root = self.run_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        latest, old = root / "latest", root / "latest.old"
        staging = root / "latest.new"
        self.policy.save_checkpoint(staging)
        (staging / STATE_FILE).write_text(self.state.to_json())
        if latest.exists():
            if old.exists():
                shutil.rmtree(old)
            latest.rename(old)
        staging.rename(latest)
        if old.exists():
            shutil.rmtree(old)
        every = self.config.trainer.save_every
        if every and self.state.step % every == 0:
            numbered = root / f"step-{self.state.step:05d}"
            if numbered.exists():
                shutil.rmtree(numbered)
            shutil.copytree(latest, numbered, ignore=shutil.ignore_patterns("trainer_state.pt"))

    # -- evaluation ----------------------------------------------------------------------------------
    async def _evaluate(self, step: int) -> dict[str, Any]:
        cfg = self.config.trainer
        ids = []
        for i, task in enumerate(self.heldout):
            rid = eval_rollout_id(step, i)
            self.store.create_rollout(
                rollout_id=rid,
                task=task.data,
                run_id=self.run_id,
                task_id=task.task_id,
                group_id=f"eval-s{step:05d}",
                step=step,
                metadata={
                    "kind": EVAL_KIND,
                    "sampling": {
                        "temperature": cfg.eval_temperature,
                        **({"max_tokens": cfg.max_tokens} if cfg.max_tokens else {}),
                    },
                },
            )
            ids.append(rid)
        while True:
            done = [await asyncio.to_thread(self.store.get_rollout, rid) for rid in ids]
            if all(r.status in TERMINAL_STATUSES for r in done):
                break
            await asyncio.sleep(0.2)
        rewards = [r.reward or 0.0 for r in done if r.outcome is not Outcome.INFRA_FAILURE]
        if not rewards:
            raise ConfigError("held-out evaluation: every rollout failed for infrastructure reasons")
        return {
            "heldout/reward": statistics.fmean(rewards),
            "heldout/accuracy": sum(1 for x in rewards if x >= 1.0) / len(rewards),
            "heldout/rollouts": len(rewards),
            "heldout/overlap_with_train": self.heldout_overlap,
        }
