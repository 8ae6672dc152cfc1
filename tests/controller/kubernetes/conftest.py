"""Fixtures for the Kubernetes runner tests: the fake API server and launches to feed it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    import tests.fakes  # noqa: F401
except ModuleNotFoundError:  # plain `pytest` (unlike `python -m pytest`) leaves the repo root off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from kubernetes.client import ApiClient, Configuration  # noqa: E402
from tests.controller.kubernetes.k8s_support import (  # noqa: E402
    CLUSTER_GATEWAY,
    POLICY,
    FakeKubernetes,
    build_launch,
)

from harnessrl.controller.base import Launch  # noqa: E402
from harnessrl.controller.kubernetes import KubernetesRunner  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake_k8s() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:
        yield fake


@pytest.fixture
def make_launch(tmp_path: Path) -> Callable[..., Launch]:
    def make(rollout_id: str = "r1", attempt: int = 0, **overrides: Any) -> Launch:
        return build_launch(tmp_path, rollout_id, attempt, **overrides)

    return make


@pytest.fixture
async def make_runner(fake_k8s: FakeKubernetes) -> AsyncIterator[Callable[..., KubernetesRunner]]:
    """Builds runners against ``fake_k8s``, each with its own ApiClient (like separate controller
    processes), and closes them after the test. ``options`` (``job_template``, ``run_id``, any
    ``KubernetesRunnerConfig`` field, ``clock``) go over the cluster gateway, ``POLICY`` and a 0.2 s
    poll."""
    made: list[tuple[KubernetesRunner, ApiClient]] = []

    def make(**options: Any) -> KubernetesRunner:
        api = ApiClient(Configuration(host=fake_k8s.url))
        settings: dict[str, Any] = dict(
            gateway_url=CLUSTER_GATEWAY, network_policy=POLICY, poll_interval_s=0.2
        )
        runner = KubernetesRunner(api, **{**settings, **options})
        made.append((runner, api))
        return runner

    yield make
    for runner, api in made:
        await runner.aclose()
        api.close()
