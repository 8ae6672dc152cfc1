"""The controller: queued rollouts in, scored rollouts out.

Loop: claim queued rollouts atomically from the store (so two controllers never launch the same
one), prepare each attempt's workspace, launch the harness through a ``Runner``, wait, run the
evaluator, audit the recorded commands for reward hacking, and finish the rollout with an outcome
and reward. Infrastructure failures (sandbox setup, evaluator crash, cluster errors) are retried as
new attempts up to ``max_infra_retries``; policy failures never are. A rollout cancelled in the store
has its process killed within one poll interval.

The loop and one attempt's course are here; the pieces each is built from live beside it:
``retries`` (what an infrastructure failure is, retry or fail), ``tamper`` (a finish by someone other
than the controller, voided), ``attempt`` (the launch and the finish metadata), ``attempt_files``
(scratch and log tails) and ``task_environments`` (the task images, mounted once).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harnessrl.controller.attempt import GatewayEndpoint, prepare_attempt
from harnessrl.controller.attempt_files import discard_attempt_scratch
from harnessrl.controller.audit import AuditConfig
from harnessrl.controller.audit.workspace import diff_workspace
from harnessrl.controller.base import ExitKind, HarnessSpec, Runner
from harnessrl.controller.evaluators import Evaluator
from harnessrl.controller.harness import check_task
from harnessrl.controller.retries import outcome_for, retry_or_fail
from harnessrl.controller.scoring import attempt_metadata, audit_attempt, evaluate_attempt
from harnessrl.controller.tamper import jsonable, void_finished_elsewhere
from harnessrl.controller.task_environments import TaskEnvironments
from harnessrl.environments.resolve import Environments
from harnessrl.errors import ConfigError, HarnessRLError, InvalidTransition, NotFound
from harnessrl.sandbox.bwrap import check_mounts
from harnessrl.sandbox.proxy import GatewayBridge
from harnessrl.sandbox.workspace import make_private_dir
from harnessrl.schemas import Outcome, Rollout, RolloutStatus, now
from harnessrl.store.base import Store
from harnessrl.store.damage import CallsUnreadable, RolloutUnreadable

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


HarnessResolver = Callable[[Rollout], HarnessSpec]


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
        self._environments = TaskEnvironments()
        if environments is not None and isinstance(harness, HarnessSpec):
            self._environments.add(harness, environments)

    def environments_for(self, harness: HarnessSpec) -> Environments:
        """The ``Environments`` of a harness spec's ``environment`` settings (one per distinct setting)."""
        return self._environments.of(harness)

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
            await self._record_failure(rollout, error)
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
        """Run the loop until the given rollouts are terminal (used by ``harnessrl rollout``, ``harnessrl
        data calibrate`` and tests). A rollout whose row was damaged meanwhile is given back as its
        plain columns tell (``RolloutUnreadable.stand_in``: the attempt ends it ``failed``,
        ``infra_failure``, naming the damage), so one damaged row does not stop the others' wait."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        terminal = {RolloutStatus.FINISHED, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
        while True:
            rollouts = [await asyncio.to_thread(self._read_for_wait, r) for r in rollout_ids]
            if all(r.status in terminal for r in rollouts) and not self._tasks:
                return rollouts
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rollouts not done after {timeout_s} s")
            await self.fill()
            await asyncio.sleep(self.config.poll_interval_s / 5)

    def _read_for_wait(self, rollout_id: str) -> Rollout:
        try:
            return self.store.get_rollout(rollout_id)
        except RolloutUnreadable as exc:
            stand_in = exc.stand_in()
            if stand_in is None:  # its status cannot be read either: nothing tells when it ends
                raise
            return stand_in

    async def shutdown(self) -> None:
        """Kill running attempts (recorded as infrastructure failures, so they are retried later)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.runner.aclose()
        await self._environments.close()  # the images this controller mounted
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
                try:
                    await asyncio.to_thread(
                        self.store.requeue_rollout,
                        rollout.rollout_id,
                        error="controller shut down",
                        attempt=rollout.attempt,
                    )
                except RolloutUnreadable as exc:  # no attempt can run it: it must not stay running
                    await self._fail_unreadable(rollout, exc)
            raise
        except RolloutUnreadable as exc:  # its row damaged while the attempt ran: no verdict fits in it
            result = await self._fail_unreadable(rollout, exc)
        except Exception as exc:  # noqa: BLE001 - a bug of ours or the store failing after launch
            # The task ended with its exception never looked at, and the rollout stayed "running" with
            # nothing running it (until this controller shut down): ended here as an infrastructure
            # failure of this attempt, like an evaluator crash.
            log.exception("rollout %s attempt %d: the controller failed", rollout.rollout_id, rollout.attempt)
            error = (
                str(exc)
                if isinstance(exc, CallsUnreadable)
                else f"controller error: {type(exc).__name__}: {exc}"
            )
            result = await self._release(rollout, error)
            if rollout.rollout_id in self._unreleased:  # the store is down: what it held last
                return rollout
        if not self.config.keep_workspaces:  # every way an attempt ends, after its verdict is recorded
            if self.on_attempt_done is not None:  # the trainer need not wait for the removal either
                self.on_attempt_done(rollout.rollout_id)
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
        unfit = await asyncio.to_thread(self._task_unfit, harness, rollout)
        if unfit is not None:  # the same task fails every attempt: one failure, not a retry each time
            return await retry_or_fail(self.store, rollout, unfit, max_retries=0)
        audit = self.config.audit
        try:
            prepared = await prepare_attempt(
                rollout,
                harness,
                attempt_dir=attempt_dir,
                gateway=self.gateway,
                run_dir=self.run_dir,
                environments=self._environments,
                image_references=getattr(self.runner, "image_references", False),
                audit=audit,
            )
            refused_before = self.bridge.refused if self.bridge is not None else 0
            handle = await self.runner.launch(prepared.launch)
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
        outcome = outcome_for(exit_)
        if outcome is None:
            return await self._infra_failure(rollout, f"harness infrastructure failure: {exit_.detail}")
        # A harness whose calls found the gateway down failed through no doing of the policy: scoring
        # it would train a 0 on what the model never saw (retried, as every infrastructure failure).
        if self.bridge is not None and await self.bridge.gateway_was_down(refused_before):
            return await self._infra_failure(
                rollout, "the gateway refused connections while the harness ran (it was down or restarting)"
            )

        try:
            calls = await asyncio.to_thread(
                self.store.list_calls, rollout.rollout_id, attempt=rollout.attempt
            )
        except Exception as exc:  # noqa: BLE001 - the store down a moment, or a row of it damaged
            raise CallsUnreadable(
                f"cannot read the attempt's recorded calls: {type(exc).__name__}: {exc}"
            ) from exc
        # Diffed before the evaluator runs: one that scores in place (sandbox "none") writes there.
        changes = None
        if prepared.before is not None:
            changes = await asyncio.to_thread(
                diff_workspace, prepared.before, workspace, audit.workspace_limits
            )
        result = await evaluate_attempt(
            self.evaluator,
            rollout,
            exit_,
            calls,
            workspace=workspace,
            attempt_dir=attempt_dir,
            root=prepared.root,
        )
        if isinstance(result, str):  # the evaluator failed: an infrastructure failure
            return await self._infra_failure(rollout, result)
        report, reward, flags = await audit_attempt(
            calls, result, audit, workspace=workspace, inside=prepared.inside, changes=changes
        )
        # Not on a later attempt's record: a requeue while this one was scored (no watcher then) let
        # the next attempt run and end, and its flags were replaced by these before this finish was
        # refused. (This attempt ended by someone else keeps them: the void adds its own flag.)
        if flags and await asyncio.to_thread(self._still_this_attempt, rollout):
            await asyncio.to_thread(self.store.set_rollout_flags, rollout.rollout_id, flags)
        metadata = attempt_metadata(
            exit_,
            result,
            report,
            calls,
            attempt_dir=attempt_dir,
            started=started,
            root=prepared.root,
            image=prepared.image,
        )
        # The verdict first, the scratch after (``run_rollout``): removing a tree the policy made takes
        # as long as the policy made it (a million hard links: 15 s between the harness's end and the
        # finish), time the rollout would sit unfinished, past ``trainer.rollout_deadline_s``.
        try:
            return await asyncio.to_thread(
                self.store.finish_rollout,
                rollout.rollout_id,
                outcome,
                reward,
                metadata=jsonable(metadata),
                attempt=rollout.attempt,
            )
        except InvalidTransition:  # cancelled or requeued meanwhile, or finished by someone else
            return await void_finished_elsewhere(self.store, rollout)

    def _still_this_attempt(self, rollout: Rollout) -> bool:
        """Whether the store's rollout is still at ``rollout``'s attempt (not requeued since)."""
        return self.store.get_rollout(rollout.rollout_id).attempt == rollout.attempt

    def _task_unfit(self, harness: HarnessSpec, rollout: Rollout) -> str | None:
        """Why the harness cannot start on the rollout's task, or the evaluator cannot score it
        (``harness.check_task``: a field a template or the evaluator needs missing); None when it fits.
        Tasks from a config or a JSONL file are checked before a run starts; one created through the
        control API (``POST /api/rollouts``) was first checked by its attempts: each an infrastructure
        failure, retried ``max_infra_retries`` times, with the scorer's message at best."""
        try:
            check_task(harness, rollout.task, self.evaluator.config)
        except ConfigError as exc:
            return f"the task does not fit: {exc}"
        return None

    async def _release(self, rollout: Rollout, error: str) -> Rollout | None:
        """``_record_failure``, or, when the store cannot take it now, remembered for the next ``fill``."""
        try:
            return await self._record_failure(rollout, error)
        except Exception:  # noqa: BLE001
            log.exception(
                "rollout %s: could not record its failure; trying again at the next poll", rollout.rollout_id
            )
            self._unreleased[rollout.rollout_id] = (rollout, error)
            return None

    async def _record_failure(self, rollout: Rollout, error: str) -> Rollout | None:
        """``_infra_failure`` of an attempt that ended with no verdict (a controller error, a store
        error), or ``_fail_unreadable`` if the rollout's row cannot be read now. (Such an attempt was
        remembered for the next ``fill`` instead, and failed every ``fill`` after, before its claim:
        the controller claimed nothing more, for good.)"""
        try:
            return await self._infra_failure(rollout, error, judge_ended=False)
        except RolloutUnreadable as exc:
            return await self._fail_unreadable(rollout, exc)

    async def _fail_unreadable(self, rollout: Rollout, damage: RolloutUnreadable) -> Rollout | None:
        """End this attempt of a rollout whose row cannot be read (a disk or a bad writer damaged it
        while the harness ran): failed, ``infra_failure``, the damage as its error, by the one write
        that needs none of the damaged columns (``fail_unreadable_rollout``). No verdict, retry or
        flag can be recorded in such a row (each merges into its JSON or returns it), and it stayed
        ``running`` for ever. The trainer leaves it out (``rollouts/row_unreadable``). What is
        returned is the rollout as claimed, with that end (the store's row cannot be read back)."""
        log.warning("rollout %s attempt %d: %s", rollout.rollout_id, rollout.attempt, damage)
        ended = await asyncio.to_thread(
            self.store.fail_unreadable_rollout,
            rollout.rollout_id,
            attempt=rollout.attempt,
        )
        if ended:
            return rollout.model_copy(
                update={
                    "status": RolloutStatus.FAILED,
                    "outcome": Outcome.INFRA_FAILURE,
                    "worker_id": None,
                    "error": str(damage),
                    "finished_at": now(),
                }
            )
        try:  # ended or requeued meanwhile, or its row reads whole again
            current = await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)
        except RolloutUnreadable:  # ended or moved on meanwhile: nothing of this attempt to record
            return rollout
        if current.status is RolloutStatus.RUNNING and current.attempt == rollout.attempt:
            return await self._infra_failure(rollout, f"controller error: {damage}", judge_ended=False)
        return current

    async def _watch_cancel(self, rollout: Rollout, handle: Any) -> None:
        """Kill the harness when its rollout is cancelled, or its attempt superseded by a requeue
        (the next attempt may already run: two harnesses must not work one rollout)."""
        while True:
            await asyncio.sleep(self.config.poll_interval_s)
            try:
                current = await asyncio.to_thread(self.store.get_rollout, rollout.rollout_id)
            except NotFound:
                continue
            except RolloutUnreadable as exc:  # damaged for good: no verdict of this attempt can be kept
                # The harness ran on until its timeout (its calls refused, 409) for an attempt that can
                # only end failed (``_fail_unreadable``, reached from this exit).
                await handle.kill(ExitKind.INFRA, f"the rollout's row cannot be read: {exc}")
                return
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
        """``retries.retry_or_fail`` under this controller's ``max_infra_retries``."""
        return await retry_or_fail(
            self.store, rollout, error, max_retries=self.config.max_infra_retries, judge_ended=judge_ended
        )
