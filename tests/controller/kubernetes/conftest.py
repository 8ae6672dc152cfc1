"""Fixtures for the Kubernetes runner tests: the fake API server and launches to feed it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import tests.fakes  # noqa: F401
except ModuleNotFoundError:  # plain `pytest` (unlike `python -m pytest`) leaves the repo root off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.controller.kubernetes.k8s_support import FakeKubernetes, build_launch  # noqa: E402

from harnessrl.controller.base import Launch  # noqa: E402


@pytest.fixture
def fake_k8s() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
def make_launch(tmp_path: Path) -> Callable[..., Launch]:
    def make(rollout_id: str = "r1", attempt: int = 0, **overrides: Any) -> Launch:
        return build_launch(tmp_path, rollout_id, attempt, **overrides)

    return make
