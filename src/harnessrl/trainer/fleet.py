"""The one boundary between the trainer and everything that produces rollouts.

The trainer speaks to a ``Fleet`` in a few verbs: ``submit`` group plans, wait for ``completed``
groups, hold generation ``paused()`` while it computes, ``publish`` new weights, and record what a
step did with its rollouts. What is behind it (store rows, the controllers that claim them,
gateways, engines) is the fleet's business. One implementation, ``fleet_gateway.GatewayFleet``,
composes a ``RolloutBook`` (below) with the gateways it drives:

- ``fleet_local.LocalGateway``: the gateway this process serves, with its gate and engine
  (embedded, or a pool of remote servers) reached in-process, and its own controller or external
  ones on the shared store;
- ``fleet_remote.RemoteGateway``: gateways elsewhere, reached over HTTP, remote engine servers the
  trainer loads itself, and external controllers.

A ``RolloutBook`` keeps a fleet's rollouts in the store: it creates a plan's rollouts, remembers the
groups still open, and finds completed ones by re-reading only the open groups' unfinished
rollouts when something may have changed: a controller in this process says so at once
(``notify``), and a slow timer covers rollouts finished elsewhere (external controllers, the
control API). No read ever scans the run, however long it has been going. The same reads enforce
the per-rollout deadline (``trainer.rollout_deadline_s``): an attempt still running past it is
cancelled through the store (its controller kills the harness) and marked
``metadata.cancelled_stuck``, so a step never waits forever on one rollout.

A call row the store cannot decode (``store.codecs`` refuses to guess: a disk or a bad writer
damaged it) ends neither the run nor its resume: the trainer reads only the final attempt's calls
where that is all it uses, and a rollout whose final attempt cannot be read is handed out in
``Group.unreadable``: the step leaves it out (out of its group's baseline too, like an
infrastructure failure) and counts it (``rollouts/calls_unreadable``). A store that cannot be
reached (``UpstreamError``) still stops the run: nothing is dropped for an outage.

A rollout row the store cannot decode (``RolloutUnreadable``) is treated the same way: the book sees
it as ended, hands it out in ``Group.rows_unreadable`` (not in ``Group.rollouts``: there is no record
to give), and the step counts it (``rollouts/row_unreadable``); a resume skips it (logged) wherever
it reads the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from harnessrl.errors import HarnessRLError, InvalidTransition, NotFound
from harnessrl.schemas import TERMINAL_STATUSES, Call, PolicyVersion, Rollout, RolloutStatus
from harnessrl.store.base import Store
from harnessrl.store.damage import CallsUnreadable, RolloutUnreadable, read_attempt_calls
from harnessrl.trainer.base import Weights
from harnessrl.trainer.failures import CANCELLED_STUCK_KEY, STOPPED_RUN_KEY, failure_signature
from harnessrl.trainer.schedule import (
    EVAL_KIND,
    TRAIN_KIND,
    GroupPlan,
    eval_redo,
    eval_rollout_id,
    run_id_prefix,
    train_rollout_id,
)

#: ``metadata`` key of an ended rollout a resumed run found sampled by a policy version after its
#: checkpoint's: weights the killed process published, then lost with the checkpoint it was still
#: writing. The version numbers are reused by the resumed run for other weights, so the label would
#: pass for on-policy; ``step.prepare_step`` drops the rollout instead (``RolloutBook.recover``).
DISCARDED_WEIGHTS_KEY = "sampled_by_discarded_weights"
#: ``metadata`` key of a rollout a step left out because its final attempt's recorded calls cannot be
#: read (``CallsUnreadable``): the reason, written with ``trained_at_step``.
CALLS_UNREADABLE_KEY = "calls_unreadable"

log = logging.getLogger(__name__)


class RolloutIdTaken(HarnessRLError):
    """A rollout id the run plans is in the store already, as another run's or another task's
    rollout: ``create_rollout`` is idempotent per id, so the run would train on that row."""


@dataclass(frozen=True)
class Group:
    """A plan whose rollouts all ended (finished, failed or cancelled), with their recorded calls."""

    plan: GroupPlan
    rollouts: tuple[Rollout, ...]
    # rollout_id -> every call of every attempt whose rows can be read, in order (the final
    # attempt's are what a step trains on; the earlier ones count only in throughput)
    calls: Mapping[str, list[Call]]
    # rollout_id -> why its final attempt's calls cannot be read: the step leaves it out
    unreadable: Mapping[str, str] = field(default_factory=dict)
    # rollout_id -> why its own row cannot be read (``RolloutUnreadable``): not in ``rollouts``,
    # left out of the step like an infrastructure failure
    rows_unreadable: Mapping[str, str] = field(default_factory=dict)

    @property
    def group_id(self) -> str:
        return self.plan.group_id


class Fleet(Protocol):
    @property
    def open_groups(self) -> int:
        """Training groups submitted and not yet handed out by ``completed``."""
        ...

    @property
    def in_flight(self) -> int:
        """Rollouts of open training groups not yet seen ended (queued or running)."""
        ...

    async def submit(self, plans: Sequence[GroupPlan]) -> None:
        """Create the plans' rollouts (idempotent per rollout id); controllers pick them up."""
        ...

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        """The ``n`` oldest complete training groups not returned before; waits for them.

        ``top_up`` is asked for more plans whenever rollouts may have ended (the trainer's
        admission policy: how much to keep in flight)."""
        ...

    async def finished(
        self, plan: GroupPlan, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> Group:
        """Wait until every rollout of a submitted plan ended (an evaluation). ``top_up`` as in
        ``completed``: training rollouts keep being admitted meanwhile, so they do not all end during
        the evaluation and start again at once, as the next step trains."""
        ...

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Inside, no model call generates: new calls wait at the gateways, in-flight ones finished
        (``UpstreamError`` if they did not drain). On exit the gateways serve again, announcing a
        version ``publish`` installed meanwhile."""
        ...

    async def release_engine_weights(self) -> bool:
        """Inside ``paused()``, before a step whose ``publish`` sends every weight: free the copy of
        the weights an engine in this process holds (``Engine.release_weights``), so the trainer's
        step has that memory; True if one did. The ``publish`` refills it."""
        ...

    async def publish(self, version: int, weights: Weights, *, restore: bool = False) -> None:
        """Install ``weights`` as policy ``version`` in every engine. Outside ``paused()`` it pauses
        and resumes around the swap itself. ``restore``: a resumed run's checkpoint, which may be
        older than what long-running gateways serve (versions otherwise never go backwards)."""
        ...

    async def check_served_weights(
        self, check: Callable[[str, list[int], list[int], list[float]], Awaitable[None]]
    ) -> None:
        """Remote servers only: sample a probe on each and await ``check(name, prompt, ids,
        logprobs)`` (the trainer compares the logprobs with its own forward pass)."""
        ...

    async def record_trained(
        self, version: int, groups: Sequence[Group], advantages: Mapping[str, float]
    ) -> None:
        """Policy ``version`` trained on ``groups``: each rollout learns the step that trained it and
        the advantage its samples got (None when none of its tokens was trained)."""
        ...

    async def mark_failed_step(self, groups: Sequence[Group], reason: str) -> None:
        """``groups`` stopped the run (``failures.common_failure``): a resumed run leaves them out."""
        ...

    async def recover(self, plans: Callable[[int], Sequence[GroupPlan]], *, policy_version: int) -> int:
        """A restarted run: requeue what a dead process left running and reopen the groups it
        created but did not train (``plans(created)``: those the schedule recreates), except those
        that failed before the policy was sampled. ``policy_version``: the checkpoint's step; an
        ended rollout sampled by a later version is marked ``DISCARDED_WEIGHTS_KEY`` (not trained).
        Returns how many groups the run created."""
        ...

    async def retire_evaluations(self, after_step: int) -> dict[int, int]:
        """A restarted run, after ``recover``: the held-out evaluations of steps after ``after_step``
        (the checkpoint's) sampled weights the kill lost. Their open rollouts are cancelled, the ended
        ones marked ``DISCARDED_WEIGHTS_KEY``; returns step -> the redo number under which the
        resumed run evaluates that step again (``TaskSchedule.redo_evaluations``)."""
        ...


def external_controllers_hint(store_url: str, gateway_url: str) -> str:
    """What to start when the run's harnesses are launched by external controllers."""
    return (
        "waiting for external controllers: harnessrl controller --config CONFIG "
        f"--store {store_url} --gateway-url {gateway_url}"
    )


class RolloutBook:
    """The store side of a fleet: open groups, and which of them are complete.

    ``deadline_s``: an attempt still running that long after it started (``Rollout.started_at``) is
    cancelled and marked ``metadata.cancelled_stuck`` (None: never). ``clock`` is the store's clock
    (wall seconds, ``schemas.now``), a seam for tests."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        *,
        poll_s: float = 1.0,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.poll_s = poll_s  # fallback re-read of open rollouts finished outside this process
        self.deadline_s = deadline_s
        self.clock = clock
        self._open: dict[str, GroupPlan] = {}  # submitted, not yet handed out, in submission order
        self._ended: set[str] = set()  # rollout ids of open groups already seen in a final state
        self._wake = asyncio.Event()

    # -- what controllers in this process call ---------------------------------------------------------
    def notify(self, rollout_id: str | None = None) -> None:
        """A rollout may have ended: re-read the open ones now instead of at the next tick."""
        self._wake.set()

    # -- counts the trainer's admission policy reads -----------------------------------------------------
    @property
    def open_groups(self) -> int:
        return sum(1 for plan in self._open.values() if plan.kind == TRAIN_KIND)

    @property
    def in_flight(self) -> int:
        """Rollouts of open training groups not yet seen ended (queued or running)."""
        return sum(
            1
            for plan in self._open.values()
            if plan.kind == TRAIN_KIND
            for rollout_id in plan.rollout_ids
            if rollout_id not in self._ended
        )

    # -- plans in, groups out ------------------------------------------------------------------------------
    async def submit(self, plans: Sequence[GroupPlan]) -> None:
        if plans:
            await asyncio.to_thread(self._create, list(plans))

    def _create(self, plans: list[GroupPlan]) -> None:
        for plan in plans:
            for rollout_id, task in plan.members:
                # The store hands back the row already under this id unchanged (how a resumed run
                # finds its rollouts): it must be this run's, of this group and task, or the run
                # would wait on and train on rollouts that are not its own.
                try:
                    row = self.store.create_rollout(
                        rollout_id=rollout_id,
                        task=task.data,
                        run_id=self.run_id,
                        task_id=task.task_id,
                        group_id=plan.group_id,
                        step=plan.step,
                        metadata={
                            "kind": plan.kind,
                            "sampling": plan.sampling.as_metadata(),
                            **({"group": plan.index} if plan.index is not None else {}),
                        },
                    )
                except RolloutUnreadable as exc:  # a resumed run's row, damaged: left out when handed out
                    log.warning("%s: the rollout is left out of its group", exc)
                    continue
                if (row.run_id, row.group_id, row.task_id) != (self.run_id, plan.group_id, task.task_id):
                    raise RolloutIdTaken(
                        f"rollout id {rollout_id!r} is taken in the store by run {row.run_id!r} "
                        f"(group {row.group_id!r}, task {row.task_id!r}); run {self.run_id!r} planned it "
                        f"for group {plan.group_id!r}, task {task.task_id!r}: give the run its own store "
                        "or another run.name"
                    )
            self._open[plan.group_id] = plan

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        def ready() -> list[GroupPlan] | None:
            done = [p for p in self._open.values() if p.kind == TRAIN_KIND and self._complete(p)]
            return done[:n] if len(done) >= n else None

        return await self._hand_out(await self._wait_until(ready, top_up))

    async def finished(
        self, plan: GroupPlan, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> Group:
        done = await self._wait_until(lambda: [plan] if self._complete(plan) else None, top_up)
        [group] = await self._hand_out(done)
        return group

    async def _wait_until(
        self,
        ready: Callable[[], list[GroupPlan] | None],
        top_up: Callable[[], Sequence[GroupPlan]] | None,
    ) -> list[GroupPlan]:
        """``ready()``'s plans once it has some, asking ``top_up`` for more plans at every wake."""
        while True:
            if top_up is not None:
                await self.submit(top_up())
            plans = ready()
            if plans is not None:
                return plans
            await self._wait_for_change()

    def _complete(self, plan: GroupPlan) -> bool:
        return all(rollout_id in self._ended for rollout_id in plan.rollout_ids)

    async def _wait_for_change(self) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 a wait_for whose wake-up (a notify) races a
        # cancellation swallows the cancellation, and a stopped run (Ctrl-C) kept waiting.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.poll_s):
                await self._wake.wait()
        self._wake.clear()
        await asyncio.to_thread(self._refresh)

    def _refresh(self) -> None:
        """Re-read the open groups' rollouts not yet seen ended (O(in flight), never O(run));
        cancel those running past the deadline."""
        for plan in list(self._open.values()):
            for rollout_id in plan.rollout_ids:
                if rollout_id in self._ended:
                    continue
                try:
                    rollout = self.store.get_rollout(rollout_id)
                    if rollout.status in TERMINAL_STATUSES or self._cancel_if_stuck(rollout):
                        self._ended.add(rollout_id)
                except RolloutUnreadable as exc:  # never readable again: ended, left out when handed out
                    log.warning("%s: the rollout is left out of its group", exc)
                    self._ended.add(rollout_id)

    def _cancel_if_stuck(self, rollout: Rollout) -> bool:
        """Cancel ``rollout`` if its attempt has been running past the deadline; whether it ended."""
        if (
            self.deadline_s is None
            or rollout.status is not RolloutStatus.RUNNING
            or rollout.started_at is None
        ):
            return False
        running_s = self.clock() - rollout.started_at
        if running_s <= self.deadline_s:
            return False
        try:
            # Its controller kills the harness. Only the attempt read above: a requeue and a fresh
            # claim since then started another attempt, whose clock starts anew (``RolloutEnded``).
            self.store.cancel_rollout(rollout.rollout_id, attempt=rollout.attempt)
        except InvalidTransition:  # it ended (or went back to the queue) meanwhile: read it again
            return self.store.get_rollout(rollout.rollout_id).status in TERMINAL_STATUSES
        stuck = {"attempt": rollout.attempt, "running_s": round(running_s, 1), "deadline_s": self.deadline_s}
        self.store.update_rollout_metadata(rollout.rollout_id, {CANCELLED_STUCK_KEY: stuck})
        return True

    async def _hand_out(self, plans: list[GroupPlan]) -> list[Group]:
        def read(plan: GroupPlan) -> Group:
            rollouts: list[Rollout] = []
            rows_unreadable: dict[str, str] = {}
            for rollout_id in plan.rollout_ids:
                try:
                    rollouts.append(self.store.get_rollout(rollout_id))
                except RolloutUnreadable as exc:
                    rows_unreadable[rollout_id] = str(exc)
            calls: dict[str, list[Call]] = {}
            unreadable: dict[str, str] = {}
            for rollout in rollouts:
                calls[rollout.rollout_id], damage = self._read_calls(rollout)
                if damage is not None:
                    unreadable[rollout.rollout_id] = damage
            return Group(plan, tuple(rollouts), calls, unreadable, rows_unreadable)

        groups = [await asyncio.to_thread(read, plan) for plan in plans]
        for plan in plans:
            del self._open[plan.group_id]
            self._ended.difference_update(plan.rollout_ids)
        return groups

    def _read_calls(self, rollout: Rollout) -> tuple[list[Call], str | None]:
        """The rollout's calls, attempt by attempt, and why its final attempt's cannot be read (None
        when they can). Attempt by attempt: a damaged row of an earlier attempt (retried, never
        trained) costs only its own calls, which count in throughput and nothing else."""
        calls: list[Call] = []
        for attempt in range(rollout.attempt + 1):
            try:
                calls += read_attempt_calls(self.store, rollout.rollout_id, attempt)
            except CallsUnreadable as exc:
                if attempt == rollout.attempt:
                    log.warning("%s: the rollout is left out of training", exc)
                    return calls, str(exc)
                log.warning("%s (an earlier attempt: the final one is read on its own)", exc)
        return calls, None

    # -- what a step records -------------------------------------------------------------------------------
    async def record_trained(
        self, version: int, groups: Sequence[Group], advantages: Mapping[str, float]
    ) -> None:
        def write() -> None:
            self.store.add_policy_version(PolicyVersion(version=version, step=version))
            for group in groups:
                for rollout in group.rollouts:
                    trained = {"trained_at_step": version, "advantage": advantages.get(rollout.rollout_id)}
                    if rollout.rollout_id in group.unreadable:
                        trained[CALLS_UNREADABLE_KEY] = group.unreadable[rollout.rollout_id]
                    self.store.update_rollout_metadata(rollout.rollout_id, trained)

        await asyncio.to_thread(write)

    async def mark_failed_step(self, groups: Sequence[Group], reason: str) -> None:
        def write() -> None:
            for group in groups:
                for rollout in group.rollouts:
                    self.store.update_rollout_metadata(rollout.rollout_id, {STOPPED_RUN_KEY: reason})

        await asyncio.to_thread(write)

    # -- a restarted run ---------------------------------------------------------------------------------
    def rollout_id_prefix(self) -> str:
        """What this run's rollout ids start with (``schedule.run_id_prefix``), or "" for a run
        created before ids had a prefix: its first group's (or first evaluation's) first rollout is
        in the store under the bare id, as this run's. Two reads, whatever the run's size."""
        bare = (train_rollout_id(0, 0), eval_rollout_id(0, 0))
        for rollout_id in bare:
            try:
                if self.store.get_rollout(rollout_id).run_id == self.run_id:
                    return ""
            except (NotFound, RolloutUnreadable):
                continue
        return run_id_prefix(self.run_id)

    async def recover(self, plans: Callable[[int], Sequence[GroupPlan]], *, policy_version: int) -> int:
        created = await asyncio.to_thread(self._requeue_and_count)
        reopened = list(plans(created))
        dead = await asyncio.to_thread(self.failed_before_sampling, reopened)
        await asyncio.to_thread(self._mark_discarded_weights, reopened, policy_version)
        await self.submit([p for p in reopened if p.group_id not in dead])
        return created

    def _mark_discarded_weights(self, plans: Sequence[GroupPlan], policy_version: int) -> None:
        """Mark the ended rollouts among ``plans`` whose final attempt called a policy version after
        ``policy_version`` (``DISCARDED_WEIGHTS_KEY``). The process that published those weights
        died before their checkpoint was whole: generation resumed under them at once (the
        checkpoint is written in the background), and the resumed run trains that version again
        with other weights. Requeued rollouts need nothing: their next attempt samples afresh."""
        for plan in plans:
            for rollout_id in plan.rollout_ids:
                try:
                    rollout = self.store.get_rollout(rollout_id)
                except NotFound:  # a group the dead process was still creating
                    continue
                except RolloutUnreadable as exc:  # no step trains it (``Group.rows_unreadable``)
                    log.warning("%s", exc)
                    continue
                if rollout.status not in TERMINAL_STATUSES or DISCARDED_WEIGHTS_KEY in rollout.metadata:
                    continue
                if later := self._versions_after(rollout, policy_version):
                    mark = {"versions": later, "resumed_at_step": policy_version}
                    self.store.update_rollout_metadata(rollout_id, {DISCARDED_WEIGHTS_KEY: mark})

    def _versions_after(self, rollout: Rollout, policy_version: int) -> list[int]:
        """The policy versions after ``policy_version`` that ``rollout``'s final attempt called; none
        when its calls cannot be read (no step trains such a rollout: ``Group.unreadable``)."""
        try:
            calls = read_attempt_calls(self.store, rollout.rollout_id, rollout.attempt)
        except CallsUnreadable as exc:
            log.warning("%s", exc)
            return []
        return sorted({c.policy_version for c in calls if c.policy_version > policy_version})

    def retire_evaluations(self, after_step: int) -> dict[int, int]:
        """``Fleet.retire_evaluations``. An evaluation at step ``s`` runs on step ``s``'s weights,
        published before their checkpoint is whole; a kill in that window resumes from an earlier
        step, trains ``s`` again with other weights and evaluates it again: under the old ids it
        would read back what the lost weights scored. Every evaluation rollout of a later step is
        retired, whatever its status (a queued one would be run for nothing)."""
        redos: dict[int, int] = {}
        for rollout in self.store.list_rollouts(run_id=self.run_id):
            if rollout.metadata.get("kind") != EVAL_KIND or rollout.step <= after_step:
                continue
            redos[rollout.step] = max(redos.get(rollout.step, 0), eval_redo(rollout.group_id) + 1)
            if rollout.status not in TERMINAL_STATUSES:
                with contextlib.suppress(InvalidTransition):  # an external controller ended it meanwhile
                    self.store.cancel_rollout(rollout.rollout_id)
                rollout = self.store.get_rollout(rollout.rollout_id)
            if DISCARDED_WEIGHTS_KEY not in rollout.metadata:
                mark = {"versions": self._versions_after(rollout, after_step), "resumed_at_step": after_step}
                self.store.update_rollout_metadata(rollout.rollout_id, {DISCARDED_WEIGHTS_KEY: mark})
        return redos

    def _requeue_and_count(self) -> int:
        """Requeue the run's rollouts a dead process left running; return how many training groups
        were already created (the schedule's next index). Reads the run once, at start-up."""
        self._requeue_listed_running("trainer restarted")
        groups = {
            r.group_id
            for r in self.store.list_rollouts(run_id=self.run_id)
            if r.metadata.get("kind") == TRAIN_KIND
        }
        return len(groups)

    def failed_before_sampling(self, plans: Sequence[GroupPlan]) -> set[str]:
        """The groups among ``plans`` whose every rollout ended without the policy being sampled
        (``failures.failure_signature``): a resumed run leaves them out. They teach nothing (no
        tokens, reward 0 everywhere) and would stop the run again (``TrainingLoop._stop_if_broken``)
        although its cause, e.g. a broken harness command, was fixed for the resume."""
        dead = set()
        for plan in plans:
            try:
                rollouts = self._readable(plan)
            except NotFound:  # a group the dead process was still creating: submit creates the rest
                continue
            # A damaged rollout row is judged as the step judges it: left out (``Group.rows_unreadable``
            # is not among the rollouts ``failures.common_failure`` reads), so a group whose readable
            # rollouts all failed before sampling stopped the run and is left out again.
            if rollouts and all(
                r.status in TERMINAL_STATUSES and self._failed_unsampled(r) for r in rollouts
            ):
                dead.add(plan.group_id)
        return dead

    def _readable(self, plan: GroupPlan) -> list[Rollout]:
        """``plan``'s rollouts whose rows can be read (a damaged one is logged and left out)."""
        rollouts = []
        for rollout_id in plan.rollout_ids:
            try:
                rollouts.append(self.store.get_rollout(rollout_id))
            except RolloutUnreadable as exc:
                log.warning("%s: the rollout is left out of its group", exc)
        return rollouts

    def _failed_unsampled(self, rollout: Rollout) -> bool:
        """Whether ``rollout`` failed before its final attempt sampled the policy (the only calls
        ``failure_signature`` looks at). An attempt with a call row that cannot be read did call."""
        try:
            calls = read_attempt_calls(self.store, rollout.rollout_id, rollout.attempt)
        except CallsUnreadable as exc:
            log.warning("%s", exc)
            return False
        return failure_signature(rollout, calls) is not None

    def requeue_running(self, error: str) -> None:
        """The run is over: what a late call or a cancelled launch left marked running goes back to
        the queue, so the store says what a later ``--resume`` will find."""
        self._requeue_listed_running(error)

    def _requeue_listed_running(self, error: str) -> None:
        """Requeue the attempts the listing saw running. One an external controller ended (or
        requeued) after the listing is left as it is: its result stands, and the rest still go
        back to the queue instead of the error ending the run's shutdown or its resume."""
        for rollout in self.store.list_rollouts(run_id=self.run_id, status=RolloutStatus.RUNNING):
            try:
                self.store.requeue_rollout(rollout.rollout_id, error=error, attempt=rollout.attempt)
            except InvalidTransition as exc:  # RolloutEnded too: a later attempt is not ours
                log.info(
                    "rollout %s moved on since it was listed running; left as it is: %s",
                    rollout.rollout_id,
                    exc,
                )
