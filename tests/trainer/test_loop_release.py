"""``TrainingLoop._step`` around the engine's released weights: freed only inside the pause of an async
step that publishes every weight, and given back (the weights it had, at the version it had) when the
step fails."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
from harnessrl.trainer.checkpoint import TrainState
from harnessrl.trainer.config import TrainConfig
from harnessrl.trainer.loop import TrainingLoop

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "tiny" / "train.toml"


def config(*overrides: str) -> TrainConfig:
    raw = resolve_relative_paths(load_raw_config(str(CONFIG), list(overrides)), CONFIG.parent)
    return validate_config(TrainConfig, raw)


class RecordingFleet:
    """The fleet calls a step makes, in order."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        self.events.append("pause")
        try:
            yield
        finally:
            self.events.append("resume")

    async def release_engine_weights(self) -> bool:
        self.events.append("release")
        return True

    async def publish(self, version: int, weights: Any, *, restore: bool = False) -> None:
        self.events.append(("publish", version))

    async def record_trained(self, *args: Any) -> None:
        self.events.append("recorded")


class Policy:
    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def train_step(self, samples, algorithm, *, temperature, micro_batch_tokens) -> dict[str, float]:  # noqa: ANN001
        if self.fail:
            raise RuntimeError("out of memory, say")
        return {}


class Checkpointer:
    async def written(self) -> float:
        return 0.0

    async def save(self, state: TrainState) -> None:
        pass


def step(cfg: TrainConfig, *, fail: bool) -> list[Any]:
    fleet = RecordingFleet()
    loop = TrainingLoop(
        config=cfg,
        fleet=fleet,  # type: ignore[arg-type]
        policy=Policy(fail),  # type: ignore[arg-type]
        schedule=None,  # type: ignore[arg-type]
        state=TrainState(step=3),
        checkpointer=Checkpointer(),  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
    )
    with contextlib.suppress(RuntimeError):
        asyncio.run(loop._step([], since=0.0))
    return fleet.events


def test_an_async_step_frees_the_engines_weights_inside_the_pause_and_publishes_after() -> None:
    assert step(config(), fail=False) == ["pause", "release", ("publish", 4), "resume", "recorded"]


def test_a_failed_step_gives_the_engine_back_the_weights_it_had() -> None:
    assert step(config(), fail=True) == ["pause", "release", ("publish", 3), "resume"]


@pytest.mark.parametrize("override", ["trainer.mode=sync", "trainer.lora.r=4"])
def test_no_release_without_a_pause_or_when_the_publish_sends_only_adapters(override: str) -> None:
    events = step(config(override), fail=False)
    assert "release" not in events and ("publish", 4) in events
