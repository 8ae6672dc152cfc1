"""A controller gives back the task images it mounted when it shuts down: each process's mount used
to stay until a forced prune (podman's count grew by one per ``harnessrl rollout``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tests.environments.image_support import TINY, tiny_store
from tests.environments.test_store import recipe

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.local import LocalRunner
from harnessrl.environments.config import EnvironmentConfig
from harnessrl.environments.resolve import Environments
from harnessrl.environments.store import ImageStore
from harnessrl.store.sqlite import SQLiteStore

__all__ = ["tiny_store"]  # the fixture, imported to be used here


def test_a_controller_shutdown_unmounts_the_images_its_rollouts_mounted(
    tiny_store: ImageStore, tmp_path: Path
):
    config = EnvironmentConfig(images={"env": recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n")})
    environments = Environments(config, store=tiny_store)
    store = SQLiteStore(tmp_path / "harnessrl.db")
    controller = Controller(
        store,
        LocalRunner(bridge_path=None),
        gateway=GatewayEndpoint("127.0.0.1", 9),
        harness=HarnessSpec(command=["true"], environment=config),
        evaluator=build_evaluator({"type": "command", "command": ["true"]}),
        run_dir=tmp_path / "run",
        environments=environments,
    )
    root = environments.root_for({"environment": "env"})  # what a rollout's launch does
    assert root is not None and os.path.ismount(root.path)  # control: mounted while the run goes on
    try:
        asyncio.run(controller.shutdown())
    finally:
        store.close()
    assert not os.path.ismount(root.path)
    assert root.image_id not in tiny_store.podman.mounted_images()
