"""The one boundary between the trainer and everything that produces rollouts.

The trainer speaks to a ``Fleet`` in a few verbs: ``submit`` group plans, wait for ``completed``
groups, hold generation ``paused()`` while it computes, and ``publish`` new weights. What is behind
it (store rows, the controllers that claim them, gateways, engines) is the fleet's business:

- ``LocalFleet`` (``fleet_local.py``): the gateway this process serves, with its gate and engine
  (embedded, or a pool of remote servers) reached in-process, and its own controller or external
  ones on the shared store.
- ``RemoteFleet`` (``fleet_remote.py``): gateways elsewhere, reached over HTTP, remote engine
  servers the trainer loads itself, and external controllers.

Both keep their rollouts in the store through a ``RolloutBook``: it creates a plan's rollouts,
remembers the groups still open, and finds completed ones by re-reading only the open groups'
unfinished rollouts when something may have changed: a controller in this process says so at once
(``notify``), and a slow timer covers rollouts finished elsewhere (external controllers, the
control API). No read ever scans the run, however long it has been going.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harnessrl.errors import NotFound
from harnessrl.schemas import TERMINAL_STATUSES, Call, Rollout, RolloutStatus
from harnessrl.store.base import Store
from harnessrl.trainer.failures import failure_signature
from harnessrl.trainer.schedule import TRAIN_KIND, GroupPlan


@dataclass(frozen=True)
class Group:
    """A plan whose rollouts all ended (finished, failed or cancelled), with their recorded calls."""

    plan: GroupPlan
    rollouts: tuple[Rollout, ...]
    calls: Mapping[str, list[Call]]  # rollout_id -> every call of every attempt, in order

    @property
    def group_id(self) -> str:
        return self.plan.group_id


class Weights(Protocol):
    """What a fleet needs from the trainer's policy to publish it (``TrainablePolicy`` is one)."""

    def engine_state_dict(self) -> dict[str, Any]:
        """Full weights under the base model's names (in-process engines load these)."""

    def save_checkpoint(self, folder: Path, *, with_optimizer: bool = True) -> Path:
        """A Hugging Face folder (engine servers load these)."""


class Fleet(Protocol):
    book: RolloutBook

    async def submit(self, plans: Sequence[GroupPlan]) -> None:
        """Create the plans' rollouts (idempotent per rollout id); controllers pick them up."""

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        """The ``n`` oldest complete training groups not returned before; waits for them.

        ``top_up`` is asked for more plans whenever rollouts may have ended (the trainer's
        admission policy: how much to keep in flight)."""

    async def finished(self, plan: GroupPlan) -> Group:
        """Wait until every rollout of a submitted plan ended (an evaluation)."""

    def paused(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Inside, no model call generates: new calls wait at the gateways, in-flight ones finished
        (``UpstreamError`` if they did not drain). On exit the gateways serve again, announcing a
        version ``publish`` installed meanwhile."""

    async def publish(self, version: int, weights: Weights, *, restore: bool = False) -> None:
        """Install ``weights`` as policy ``version`` in every engine. Outside ``paused()`` it pauses
        and resumes around the swap itself. ``restore``: a resumed run's checkpoint, which may be
        older than what long-running gateways serve (versions otherwise never go backwards)."""

    async def check_served_weights(
        self, check: Callable[[str, list[int], list[int], list[float]], Awaitable[None]]
    ) -> None:
        """Remote servers only: sample a probe on each and await ``check(name, prompt, ids,
        logprobs)`` (the trainer compares the logprobs with its own forward pass)."""


def external_controllers_hint(store_url: str, gateway_url: str) -> str:
    """What to start when the run's harnesses are launched by external controllers."""
    return (
        "waiting for external controllers: harnessrl controller --config CONFIG "
        f"--store {store_url} --gateway-url {gateway_url}"
    )


class RolloutBook:
    """The store side of a fleet: open groups, and which of them are complete."""

    def __init__(self, store: Store, run_id: str, *, poll_s: float = 1.0) -> None:
        self.store = store
        self.run_id = run_id
        self.poll_s = poll_s  # fallback re-read of open rollouts finished outside this process
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
                self.store.create_rollout(
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
            self._open[plan.group_id] = plan

    async def completed(
        self, n: int, *, top_up: Callable[[], Sequence[GroupPlan]] | None = None
    ) -> list[Group]:
        while True:
            if top_up is not None:
                await self.submit(top_up())
            done = [p for p in self._open.values() if p.kind == TRAIN_KIND and self._complete(p)]
            if len(done) >= n:
                return await self._hand_out(done[:n])
            await self._wait_for_change()

    async def finished(self, plan: GroupPlan) -> Group:
        while not self._complete(plan):
            await self._wait_for_change()
        [group] = await self._hand_out([plan])
        return group

    def _complete(self, plan: GroupPlan) -> bool:
        return all(rollout_id in self._ended for rollout_id in plan.rollout_ids)

    async def _wait_for_change(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.poll_s)
        self._wake.clear()
        await asyncio.to_thread(self._refresh)

    def _refresh(self) -> None:
        """Re-read the open groups' rollouts not yet seen ended (O(in flight), never O(run))."""
        for plan in list(self._open.values()):
            for rollout_id in plan.rollout_ids:
                if (
                    rollout_id not in self._ended
                    and self.store.get_rollout(rollout_id).status in TERMINAL_STATUSES
                ):
                    self._ended.add(rollout_id)

    async def _hand_out(self, plans: list[GroupPlan]) -> list[Group]:
        def read(plan: GroupPlan) -> Group:
            rollouts = tuple(self.store.get_rollout(r) for r in plan.rollout_ids)
            calls = {r.rollout_id: self.store.list_calls(r.rollout_id) for r in rollouts}
            return Group(plan, rollouts, calls)

        groups = [await asyncio.to_thread(read, plan) for plan in plans]
        for plan in plans:
            del self._open[plan.group_id]
            self._ended.difference_update(plan.rollout_ids)
        return groups

    # -- a restarted run ---------------------------------------------------------------------------------
    def recover(self) -> int:
        """Requeue the run's rollouts a dead process left running; return how many training groups
        were already created (the schedule's next index). Reads the run once, at start-up."""
        for rollout in self.store.list_rollouts(run_id=self.run_id, status=RolloutStatus.RUNNING):
            self.store.requeue_rollout(rollout.rollout_id, error="trainer restarted")
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
                rollouts = [self.store.get_rollout(r) for r in plan.rollout_ids]
            except NotFound:  # a group the dead process was still creating: submit creates the rest
                continue
            if all(
                r.status in TERMINAL_STATUSES and failure_signature(r, self.store.list_calls(r.rollout_id))
                for r in rollouts
            ):
                dead.add(plan.group_id)
        return dead

    def requeue_running(self, error: str) -> None:
        """The run is over: what a late call or a cancelled launch left marked running goes back to
        the queue, so the store says what a later ``--resume`` will find."""
        for rollout in self.store.list_rollouts(run_id=self.run_id, status=RolloutStatus.RUNNING):
            self.store.requeue_rollout(rollout.rollout_id, error=error)
