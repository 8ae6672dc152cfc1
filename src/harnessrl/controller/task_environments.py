"""The task environments a controller's rollouts run in (docs/environments.md): one ``Environments``
per distinct ``harness.environment`` setting, so images are built, mounted and checked once, and
given back when the controller shuts down.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from harnessrl.controller.base import HarnessSpec
from harnessrl.environments.resolve import Environments, HarnessNeeds
from harnessrl.environments.stopping import in_thread_stoppably
from harnessrl.errors import HarnessRLError
from harnessrl.sandbox.host import files_in_argv
from harnessrl.sandbox.rootfs import ImageRoot
from harnessrl.schemas import Rollout

log = logging.getLogger(__name__)


class TaskEnvironments:
    """``Environments`` by harness setting (``HarnessSpec.environment``), made on first use."""

    def __init__(self) -> None:
        self._by_setting: dict[str, Environments] = {}

    def add(self, harness: HarnessSpec, environments: Environments) -> None:
        """Use ``environments`` for ``harness``'s setting (one the caller made, images already built)."""
        self._by_setting[_setting_key(harness)] = environments

    def of(self, harness: HarnessSpec) -> Environments:
        """The ``Environments`` of a harness spec's ``environment`` settings (one per distinct setting)."""
        key = _setting_key(harness)
        if key not in self._by_setting:
            self._by_setting[key] = Environments(harness.environment)
        return self._by_setting[key]

    async def locate(
        self, harness: HarnessSpec, rollout: Rollout, argv: list[str], workspace: Path, *, references: bool
    ) -> tuple[ImageRoot | None, str | None]:
        """``(root, image)`` of a rollout's task: its image mounted here (local runner) or the reference a
        cluster pulls (``references``: a runner with ``image_references``); ``(None, None)`` for the host.
        An image built here on demand is built in a worker thread that stops with this call's task
        (``in_thread_stoppably``): cancelled (a controller shutting down), its build is killed and the
        thread awaited; other rollouts' builds go on."""
        if harness.environment is None:
            return None, None
        environments = self.of(harness)
        if references:
            return None, await in_thread_stoppably(environments.reference_for, rollout.task)
        mounts = (*(Path(m) for m in harness.mounts), *files_in_argv(argv, inside=workspace))
        needs = HarnessNeeds(tuple(argv[:1]), tuple(mounts))
        return await in_thread_stoppably(environments.require, rollout.task, needs), None

    async def close(self) -> None:
        """Give back the images mounted here, now that the sandboxes are gone (each process's mount
        otherwise stayed until a forced prune; a later rollout mounts again)."""
        for environments in self._by_setting.values():
            try:
                await asyncio.to_thread(environments.close)
            except HarnessRLError as exc:
                log.warning("could not unmount a task image: %s", exc)


def _setting_key(harness: HarnessSpec) -> str:
    return harness.environment.model_dump_json() if harness.environment is not None else ""
