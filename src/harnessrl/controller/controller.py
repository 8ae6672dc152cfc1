"""The controller: queued rollouts in, scored rollouts out.

Loop: claim queued rollouts atomically from the store (so two controllers never launch the same
one), prepare each attempt's workspace, launch the harness through a ``Runner``, wait, run the
evaluator, audit the recorded commands for reward hacking, and finish the rollout with an outcome
and reward. Infrastructure failures (sandbox setup, evaluator crash, cluster errors) are retried as
new attempts up to ``max_infra_retries``; policy failures never are. A rollout cancelled in the store
has its process killed within one poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.controller.audit import AuditConfig, audit_rollout, reward_after_audit
from harnessrl.controller.audit.workspace import diff_workspace, snapshot_workspace
from harnessrl.controller.base import ROLLOUT_PATHS, Exit, ExitKind, HarnessSpec, Launch, Runner, SandboxPaths
from harnessrl.controller.evaluators import EvaluationInput, Evaluator, EvaluatorError
from harnessrl.controller.harness import harness_view, render_harness
from harnessrl.environments.resolve import Environments, HarnessNeeds
from harnessrl.errors import HarnessRLError, InvalidTransition, NotFound
from harnessrl.sandbox.bwrap import check_mounts
from harnessrl.sandbox.host import files_in_argv
from harnessrl.sandbox.proxy import GatewayBridge
from harnessrl.sandbox.workspace import make_private_dir, prepare_workspace
from harnessrl.schemas import Outcome, Rollout, RolloutStatus
from harnessrl.store.base import DROPPED_CALLS_KEY, Store
from harnessrl.trajectory.samples import CALLS_SEEN_KEY

log = logging.getLogger(__name__)


class ControllerConfig(BaseModel):
    # allow_inf_nan=False: ``poll_interval_s = inf`` passed ``gt=0`` and then slept forever after the
    # rollout finished; every float setting here is refused unless finite.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    concurrency: int = Field(default=4, ge=1, description="rollouts running at once")
    max_infra_retries: int = Field(default=2, ge=0, description="new attempts after infrastructure failures")
    poll_interval_s: float = Field(default=0.5, gt=0)
    keep_workspaces: bool = Field(
        default=True,
        description="keep each attempt's workspace and home for inspection (logs are always kept)",
    )
    audit: AuditConfig = Field(default_factory=AuditConfig)


@dataclass(frozen=True)
class GatewayEndpoint:
    """Where harnesses reach the gateway (inside a sandbox, the same port on its own loopback)."""

    host: str
    port: int

    def base_url(self, rollout_id: str) -> str:
        return f"http://{self.host}:{self.port}/rollouts/{rollout_id}/v1"


HarnessResolver = Callable[[Rollout], HarnessSpec]

TAMPER_FINISHED = "tamper_finished"  # the flag of a rollout finished behind its controller's back
#: The metadata key of a voided rollout holding the outcome and reward of the finish that was voided.
VOIDED_FINISH_KEY = "voided_finish"
#: The rollout metadata key counting its attempts that ended in an infrastructure failure (what
#: ``max_infra_retries`` bounds; attempts a shutdown or a requeue ended are not among them).
INFRA_FAILURES_KEY = "infra_failures"


def _outcome_for(exit_: Exit) -> Outcome | None:
    """The outcome an exit implies before evaluation; ``None`` for an infrastructure failure."""
    if exit_.kind is ExitKind.INFRA:
        return None
    if exit_.kind is ExitKind.TIMEOUT:
        return Outcome.TIMEOUT
    if exit_.kind is ExitKind.EXITED and exit_.exit_code == 0:
        return Outcome.SUCCESS
    return Outcome.POLICY_FAILURE


class Controller:
    def __init__(
        self,
        store: Store,
        runner: Runner,
        *,
        gateway: GatewayEndpoint,
        harness: HarnessSpec | HarnessResolver,
        evaluator: Evaluator,
        run_dir: Path,
        config: ControllerConfig | None = None,
        run_id: str | None = None,
        worker_id: str | None = None,
        environments: Environments | None = None,
        bridge: GatewayBridge | None = None,
    ):
        self.store = store
        self.runner = runner
        self.gateway = gateway
        # The sandboxes' way to the gateway: it tells an attempt whose gateway was down (the harness's
        # calls refused) from one the policy failed (``GatewayBridge.gateway_was_down``).
        self.bridge = bridge
        self._harness = harness
        self.evaluator = evaluator
        # Absolute: the workspace paths it hands the harness and the scorer ({workspace}) are read from
        # other folders (the scorer runs in its own); a relative one made every such path miss (reward 0).
        self.run_dir = make_private_dir(Path(run_dir).absolute())  # holds the store's neighbours: 0700
        if isinstance(harness, HarnessSpec):  # a resolver's specs are checked per rollout, at launch
            check_mounts(harness.mounts, forbidden=[self.run_dir])
        self.config = config or ControllerConfig()
        self.run_id = run_id
        # Unique to this controller object: ``shutdown`` requeues every running rollout the store says
        # is this worker's. ``host-pid`` alone was shared by two controllers in one process, or in two
        # containers on one host (``--network host`` keeps the host's name, and each is pid 1): one
        # stopping requeued, and so killed, the other's attempts.
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._tasks: set[asyncio.Task[Rollout]] = set()
        # Attempts that ended while the store could not be written (``_release``): recorded at the next
        # ``fill``, so a store that comes back never keeps a rollout "running" with nothing running it.
        self._unreleased: dict[str, tuple[Rollout, str]] = {}
        self._claim: asyncio.Future[list[Rollout]] | None = None  # the last claim (``fill``)
        self._stopping = asyncio.Event()
        # Called with a rollout's id whenever one of its attempts ends here (finished, failed, or
        # requeued for another attempt): how a trainer in this process learns of completions
        # without polling the store (``trainer.fleet.RolloutBook.notify``).
        self.on_attempt_done: Callable[[str], None] | None = None
        # Each task's environment (docs/environments.md): images built, mounted and checked once.
        self._environments: dict[str, Environments] = {}
        if environments is not None and isinstance(harness, HarnessSpec):
            self._environments[_environment_key(harness)] = environments

    def environments_for(self, harness: HarnessSpec) -> Environments:
        """The ``Environments`` of a harness spec's ``environment`` settings (one per distinct setting)."""
        key = _environment_key(harness)
        if key not in self._environments:
            self._environments[key] = Environments(harness.environment)
        return self._environments[key]

    async def _environment(self, harness: HarnessSpec, rollout: Rollout, argv: list[str], workspace: Path):
        """``(root, image)`` of a rollout's task: its image mounted here (local runner) or the reference a
        cluster pulls (a runner with ``image_references``); ``(None, None)`` for the host."""
        if harness.environment is None:
            return None, None
        environments = self.environments_for(harness)
        if getattr(self.runner, "image_references", False):
            return None, await asyncio.to_thread(environments.reference_for, rollout.task)
        mounts = (*(Path(m) for m in harness.mounts), *files_in_argv(argv, inside=workspace))
        needs = HarnessNeeds(tuple(argv[:1]), tuple(mounts))
        return await asyncio.to_thread(environments.require, rollout.task, needs), None

    def harness_for(self, rollout: Rollout) -> HarnessSpec:
        return self._harness if isinstance(self._harness, HarnessSpec) else self._harness(rollout)

    # -- the loop -------------------------------------------------------------------------------------
    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        """Claim and run rollouts until ``stop`` is set; then cancel running attempts and return."""
        stop = stop or self._stopping
        try:
            while not stop.is_set():
                try:
                    await self.fill()
                except Exception:  # noqa: BLE001 - the store down a moment: the running attempts go on
                    # One failed claim (a database restart, a lock timeout) ended the loop, and with it
                    # every running attempt, killed and requeued by the shutdown below.
                    log.exception("controller: claiming rollouts failed; trying again at the next poll")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.poll_interval_s)
        finally:
            await self.shutdown()

    async def fill(self) -> list[Rollout]:
        """Claim as many queued rollouts as free slots allow and start them."""
        for rollout, error in list(self._unreleased.values()):  # the store is back: record them first
            await self._infra_failure(rollout, error, judge_ended=False)
            self._unreleased.pop(rollout.rollout_id, None)
            if self.on_attempt_done is not None:
                self.on_attempt_done(rollout.rollout_id)
        free = self.config.concurrency - len(self._tasks)
        if free <= 0:
            return []
        # Shielded, and waited for by ``shutdown``: a loop cancelled while the claim ran in its thread
        # left what it claimed "running" for good (the shutdown looked before the claim committed).
        self._claim = asyncio.ensure_future(
            asyncio.to_thread(self.store.claim_rollouts, self.worker_id, free, run_id=self.run_id)
        )
        claimed = await asyncio.shield(self._claim)
        for rollout in claimed:
            task = asyncio.create_task(self.run_rollout(rollout), name=f"rollout-{rollout.rollout_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(functools.partial(self._attempt_done, rollout.rollout_id))
        return claimed

    def _attempt_done(self, rollout_id: str, task: asyncio.Task[Rollout]) -> None:
        if self.on_attempt_done is not None:
            self.on_attempt_done(rollout_id)

    async def run_until_done(self, rollout_ids: list[str], timeout_s: float | None = None) -> list[Rollout]:
        """Run the loop until the given rollouts are terminal (used by ``harnessrl rollout`` and tests)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        terminal = {RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
        while True:
            rollouts = [await asyncio.to_thread(self.store.get_rollout, r) for r in rollout_ids]
            if all(r.status in terminal for r in rollouts) and not self._tasks:
                return rollouts
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rollouts not done after {timeout_s} s")
            await self.fill()
            await asyncio.sleep(self.config.poll_interval_s / 5)

    async def shutdown(self) -> None:
        """Kill running attempts (recorded as infrastructure failures, so they are retried later)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.aclose()
        # The images this controller mounted, given back now that its sandboxes are gone (each
        # process's mount otherwise stayed until a forced prune; a later rollout mounts again).
        for environments in self._environments.values():
            try:
                await asyncio.to_thread(environments.close)
            except HarnessRLError as exc:
                log.warning("could not unmount a task image: %s", exc)
        # A task cancelled before it first ran never got to requeue its rollout, nor did a claim still
        # in its thread when ``fill`` was cancelled get a task: release every claim, once all are in.
        if self._claim is not None and not self._claim.done():
            await asyncio.gather(self._claim, return_exceptions=True)
        for rollout in await asyncio.to_thread(
            self.store.list_rollouts, run_id=self.run_id, status=RolloutStatus.RUNNING
        ):
            if rollout.worker_id == self.worker_id:
                with contextlib.suppress(HarnessRLError):
                    await asyncio.to_thread(
                        self.store.requeue_rollout, rollout.rollout_id, error="controller shut down"
                    )

    # -- one rollout ----------------------------------------------------------------------------------
    async def run_rollout(self, rollout: Rollout) -> Rollout:
        """Run one attempt of a claimed (running) rollout.

        After an infrastructure failure with retries left the rollout is requeued and this returns;
        the next attempt is claimed like any queued rollout (atomically, by whichever controller gets
        it first). Re-claiming it here instead raced with ``fill`` and could run two attempts at once.
        """
        try:
            result = await self._run_attempt(rollout)
        except asyncio.CancelledError:
            if not self.config.keep_workspaces:  # best effort: the runner kills the harness after this
                await asyncio.to_thread(discard_attempt_scratch, self._attempt_dir(rollout))
            with contextlib.suppress(HarnessRLError):  # (a later attempt's rollout is not requeued)
                await asyncio.to_thread(
                    self.store.requeue_rollout,
                    rollout.rollout_id,
                    error="controller shut down",
                    attempt=rollout.attempt,
                )
            raise
        except Exception as exc:  # noqa: BLE001 - a bug of ours or the store failing after launch
            # The task ended with its exception never looked at, and the rollout stayed "running" with
            # nothing running it (until this controller shut down): ended here as an infrastructure
            # failure of this attempt, like an evaluator crash.
            log.exception("rollout %s attempt %d: the controller failed", rollout.rollout_id, rollout.attempt)
            result = await self._release(rollout, f"controller error: {type(exc).__name__}: {exc}")
            if rollout.rollout_id in self._unreleased:  # the store is down: what it held last
                return rollout
        if not self.config.keep_workspaces:  # every way an attempt ends (the finish path did it already)
            await asyncio.to_thread(discard_attempt_scratch, self._attempt_dir(rollout))
        if result is not None:
            return result
        return await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)

    def _attempt_dir(self, rollout: Rollout) -> Path:
        return self.run_dir / "rollouts" / rollout.rollout_id / f"attempt-{rollout.attempt}"

    async def _run_attempt(self, rollout: Rollout) -> Rollout | None:
        attempt_dir = self._attempt_dir(rollout)
        workspace = attempt_dir / "workspace"
        # A previous controller died mid-attempt: start clean (its home too, or this attempt's harness
        # would start from what the dead one's wrote).
        await asyncio.to_thread(discard_attempt_scratch, attempt_dir)
        harness = self.harness_for(rollout)
        try:
            check_mounts(harness.mounts, forbidden=[self.run_dir])
            inside = ROLLOUT_PATHS if harness.sandbox == "bwrap" else None
            rendered = render_harness(
                harness,
                rollout=rollout,
                workspace=workspace,
                base_url=self.gateway.base_url(rollout.rollout_id),
                anthropic_base_url=f"http://{self.gateway.host}:{self.gateway.port}/rollouts/{rollout.rollout_id}",
                inside=inside,
            )
            await asyncio.to_thread(
                prepare_workspace,
                workspace,
                repo=rendered.repo,
                files=rendered.files,
                git_history=harness.git_history,
            )
            root, image = await self._environment(harness, rollout, rendered.argv, workspace)
            # What the harness starts from, so the audit reads what it wrote, not only what it typed.
            audit, before = self.config.audit, None
            if audit.reads_workspace:
                before = await asyncio.to_thread(snapshot_workspace, workspace, audit.workspace_limits)
            launch = Launch(
                rollout_id=rollout.rollout_id,
                attempt=rollout.attempt,
                argv=rendered.argv,
                env=rendered.env,
                task=harness_view(rollout.task),  # what the runner may show the harness
                files=rendered.files,
                workspace=workspace,
                cwd=rendered.cwd,
                log_dir=attempt_dir,
                timeout_s=harness.timeout_s,
                limits=harness.limits,
                network=harness.network,
                gateway_port=self.gateway.port,
                sandbox=harness.sandbox,
                home=workspace.parent / "home",
                task_file=rendered.task_file,
                mounts=tuple(Path(m) for m in harness.mounts),
                root=root,
                image=image,
                inside=inside,
            )
            refused_before = self.bridge.refused if self.bridge is not None else 0
            handle = await self.runner.launch(launch)
        except HarnessRLError as exc:
            return await self._infra_failure(rollout, f"launch failed: {exc}")
        except OSError as exc:
            return await self._infra_failure(rollout, f"launch failed: {exc}")

        watcher = asyncio.create_task(self._watch_cancel(rollout, handle))
        try:
            started = time.time()
            exit_ = await handle.wait()
        finally:
            watcher.cancel()
        self.runner.forget(handle)
        if exit_.kind is ExitKind.CANCELLED:
            return await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)
        outcome = _outcome_for(exit_)
        if outcome is None:
            return await self._infra_failure(rollout, f"harness infrastructure failure: {exit_.detail}")
        # A harness whose calls found the gateway down failed through no doing of the policy: scoring
        # it would train a 0 on what the model never saw (retried, as every infrastructure failure).
        if self.bridge is not None and await self.bridge.gateway_was_down(refused_before):
            return await self._infra_failure(
                rollout, "the gateway refused connections while the harness ran (it was down or restarting)"
            )

        calls = await asyncio.to_thread(self.store.list_calls, rollout.rollout_id, attempt=rollout.attempt)
        # Diffed before the evaluator runs: one that scores in place (sandbox "none") writes there.
        changes = None
        if before is not None:
            changes = await asyncio.to_thread(diff_workspace, before, workspace, audit.workspace_limits)
        stdout_path = attempt_dir / "stdout.log"
        try:
            result = await self.evaluator.evaluate(
                EvaluationInput(
                    task=rollout.task,
                    workspace=workspace,
                    calls=calls,
                    exit_code=exit_.exit_code,
                    exit_kind=exit_.kind.value,
                    stdout=await asyncio.to_thread(file_tail, stdout_path, STDOUT_FOR_EVALUATOR_BYTES),
                    # None: the evaluator writes the full task (hidden fields included) to its own file
                    task_file=None,
                    rollout_id=rollout.rollout_id,
                    environment=root,
                )
            )
        except EvaluatorError as exc:
            return await self._infra_failure(rollout, f"evaluator failed: {exc}")
        except Exception as exc:  # a bug of ours must still end the rollout, never leave it running
            log.exception("rollout %s: the evaluator raised", rollout.rollout_id)
            return await self._infra_failure(rollout, f"evaluator crashed: {type(exc).__name__}: {exc}")

        report = await asyncio.to_thread(  # reading a workspace diff takes a while: off the event loop
            audit_rollout, calls, audit, workspace=_seen_folders(workspace, inside), changes=changes
        )
        reward = reward_after_audit(float(result.reward), report, self.config.audit)
        flags = list(dict.fromkeys([*result.flags, *report.rules]))  # the scorer's and the audit's
        if flags:
            await asyncio.to_thread(self.store.set_rollout_flags, rollout.rollout_id, flags)
        metadata: dict[str, Any] = {
            "exit": {"kind": exit_.kind.value, "code": exit_.exit_code, "detail": exit_.detail},
            "evaluation": result.details,
            "audit": [flag.model_dump() for flag in report.flags],
            "audit_files": {"changed": report.files_checked, "bounds": report.workspace_bounds},
            "reward_before_audit": float(result.reward),
            "log_dir": str(attempt_dir),
            "stderr_tail": log_tail(attempt_dir),
            "harness_seconds": round(time.time() - started, 3),
            # How many calls the evaluator and audit read: a call the gateway recorded after this
            # (its rollout not yet finished) is never trained on (trajectory.samples.CALLS_SEEN_KEY).
            CALLS_SEEN_KEY: len(calls),
        }
        if root is not None or image is not None:  # which image the harness and the scorer ran on
            metadata["environment"] = {
                "image": root.name if root is not None else image,
                "image_id": root.image_id[:12] if root is not None else None,
            }
        if not self.config.keep_workspaces:  # before the finish: a finished rollout's scratch is gone
            await asyncio.to_thread(discard_attempt_scratch, attempt_dir)
        try:
            return await asyncio.to_thread(
                self.store.finish_rollout,
                rollout.rollout_id,
                outcome,
                reward,
                metadata=_jsonable(metadata),
                attempt=rollout.attempt,
            )
        except InvalidTransition:  # cancelled or requeued meanwhile, or finished by someone else
            return await self._finished_elsewhere(rollout)

    async def _finished_elsewhere(self, rollout: Rollout) -> Rollout:
        """Only this controller finishes a rollout attempt it is running. One that is already
        finished or failed (not cancelled) in this attempt when the controller comes to end it was
        ended by someone else — the agent, with a stolen admin key: its reward is void (0) and it is
        flagged ``tamper_finished``. That includes an ``infra_failure`` it declared (status failed:
        left out of its group's baseline, which a failing policy prefers to a 0), and an end it wrote
        before making its attempt an infrastructure failure (the ended rollout refused the retry).
        A later attempt's result (a requeue superseded this one: a restarted trainer requeues what it
        finds running) is not this attempt's to judge."""
        rollout_id = rollout.rollout_id
        current = await asyncio.to_thread(self.store.get_rollout, rollout_id)
        ended = current.status in (RolloutStatus.FINISHED, RolloutStatus.FAILED)
        if not ended or current.attempt != rollout.attempt:
            return current
        log.warning("rollout %s was finished by someone other than its controller: tampering", rollout_id)
        # Its metadata as this attempt began (``rollout``, as claimed), with the gateway's count of
        # dropped calls: whatever the other finish merged in (``calls_seen = 0``, a mark that keeps it
        # out of training) would otherwise turn the void 0 into "not counted".
        kept = {**rollout.metadata, **{k: v for k, v in current.metadata.items() if k == DROPPED_CALLS_KEY}}
        kept[VOIDED_FINISH_KEY] = {
            "outcome": current.outcome.value if current.outcome else None,
            "reward": current.reward,
        }
        return await asyncio.to_thread(
            functools.partial(
                self.store.void_rollout,
                rollout_id,
                flag=TAMPER_FINISHED,
                error=f"finished by someone other than its controller (reward {current.reward} voided)",
                metadata=_jsonable(kept),
            )
        )

    async def _release(self, rollout: Rollout, error: str) -> Rollout | None:
        """``_infra_failure``, or, when the store cannot take it now, remembered for the next ``fill``."""
        try:
            return await self._infra_failure(rollout, error, judge_ended=False)
        except Exception:  # noqa: BLE001
            log.exception(
                "rollout %s: could not record its failure; trying again at the next poll", rollout.rollout_id
            )
            self._unreleased[rollout.rollout_id] = (rollout, error)
            return None

    async def _watch_cancel(self, rollout: Rollout, handle: Any) -> None:
        """Kill the harness when its rollout is cancelled, or its attempt superseded by a requeue
        (the next attempt may already run: two harnesses must not work one rollout)."""
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                current = await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)
            except NotFound:
                continue
            except Exception as exc:  # noqa: BLE001 - the store down a moment: look again next poll
                # This task used to die of it, and a cancel after that never killed the harness.
                log.warning("rollout %s: cannot read its state (%s); looking again", rollout.rollout_id, exc)
                continue
            if current.status is RolloutStatus.CANCELLED or current.attempt != rollout.attempt:
                await handle.kill(ExitKind.CANCELLED)
                return

    async def _infra_failure(
        self, rollout: Rollout, error: str, *, judge_ended: bool = True
    ) -> Rollout | None:
        """Retry as a new attempt while retries are left (returns None), else fail the rollout.
        A rollout someone else ended in this attempt meanwhile is judged by ``_finished_elsewhere``
        unless ``judge_ended`` is off (after a store error: the end may be this controller's own
        write, committed before the error reached it).

        Retries are counted in the rollout's metadata (``INFRA_FAILURES_KEY``), not read off its
        attempt number: that one also counts the attempts a shutdown or a restarted trainer requeued,
        so a rollout interrupted twice failed for good at its first infrastructure failure."""
        log.warning("rollout %s attempt %d: %s", rollout.rollout_id, rollout.attempt, error)
        rollout_id = rollout.rollout_id
        try:
            current = await asyncio.to_thread(self.store.get_rollout, rollout_id)
            if current.status is not RolloutStatus.RUNNING or current.attempt != rollout.attempt:
                return await self._ended_meanwhile(rollout, current, judge_ended)
            earlier = current.metadata.get(INFRA_FAILURES_KEY)
            failures = (earlier if isinstance(earlier, int) and earlier >= 0 else 0) + 1
            await asyncio.to_thread(
                self.store.update_rollout_metadata, rollout_id, {INFRA_FAILURES_KEY: failures}
            )
            if failures <= self.config.max_infra_retries:
                await asyncio.to_thread(
                    self.store.requeue_rollout, rollout_id, error=error, attempt=rollout.attempt
                )
                return None
            return await asyncio.to_thread(
                self.store.finish_rollout,
                rollout_id,
                Outcome.INFRA_FAILURE,
                0.0,
                error=error,
                attempt=rollout.attempt,
            )
        except InvalidTransition:
            return await self._ended_meanwhile(rollout, None, judge_ended)

    async def _ended_meanwhile(self, rollout: Rollout, current: Rollout | None, judge: bool) -> Rollout:
        if judge:
            return await self._finished_elsewhere(rollout)
        return current or await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)


#: What of an attempt's folder is scratch, removed when ``keep_workspaces`` is off: the workspace and
#: the harness's ``$HOME`` (either can hold whatever the harness wrote: 50 MB in ``$HOME/blob`` stayed
#: behind when only the workspace was removed). The logs, the task file and the sandbox spec stay:
#: ``metadata.log_dir`` names them for whoever looks into a rollout.
ATTEMPT_SCRATCH = ("workspace", "home")


def discard_attempt_scratch(attempt_dir: Path) -> None:
    """Remove an attempt's scratch folders (``ATTEMPT_SCRATCH``). ``rmtree`` works through folder
    descriptors, so a tree nested past ``PATH_MAX`` goes too."""
    for name in ATTEMPT_SCRATCH:
        shutil.rmtree(attempt_dir / name, ignore_errors=True)


def _seen_folders(workspace: Path, inside: SandboxPaths | None) -> tuple[Path, ...]:
    """The folders the policy's commands may name as its own: the workspace and home as the harness
    saw them, and their host paths (a harness outside the sandbox, or a path read from a log)."""
    host = (workspace, workspace.parent / "home")
    return (*host, inside.workspace, inside.home) if inside is not None else host


def _environment_key(harness: HarnessSpec) -> str:
    return harness.environment.model_dump_json() if harness.environment is not None else ""


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


#: The end of the harness's stdout an evaluator gets (``EvaluationInput.stdout``): a harness may print
#: without bound (its memory cap does not bound a file), and all of it was read into the controller,
#: which every rollout shares, on its event loop.
STDOUT_FOR_EVALUATOR_BYTES = 1 << 20


def file_tail(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` of ``path`` as text (undecodable bytes replaced); "" if there is none."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def log_tail(attempt_dir: Path, *, max_chars: int = 600) -> str:
    """The last lines of the harness's stderr (Kubernetes: the merged pod log): what a harness that
    failed before the policy had a say printed, kept with the rollout so a run can tell that every
    rollout of a step failed the same way (``trainer.failures.common_failure``)."""
    for name in ("stderr.log", "stdout.log"):
        tail = file_tail(attempt_dir / name, max_chars)
        if tail:
            return tail.strip()[-max_chars:]
    return ""
