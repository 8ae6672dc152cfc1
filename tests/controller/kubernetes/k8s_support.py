"""Shared constants and builders for the Kubernetes runner tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.kubernetes_api import FakeKubernetes

from harnessrl.controller.base import Launch, ResourceLimits
from harnessrl.controller.kubernetes import manifests

__all__ = [
    "CLUSTER_GATEWAY",
    "KEY",
    "LOCAL_GATEWAY",
    "POLICY",
    "FakeKubernetes",
    "build_launch",
    "job_manifest",
    "until",
]

KEY = "hrl-rk-0123456789abcdef"
LOCAL_GATEWAY = "http://127.0.0.1:18080"
# The gateway Service by cluster IP: pods get no DNS unless network_policy.allow_dns says so.
CLUSTER_GATEWAY = "http://10.96.12.7:8000"
# The runners' network policy: the gateway's port, its pods by label.
POLICY = {"gateway_port": 8000, "gateway_pod_labels": {"app": "harnessrl-gateway"}}


def build_launch(root: Path, rollout_id: str = "r1", attempt: int = 0, **overrides: Any) -> Launch:
    """A Launch as the controller renders it for the local machine (local gateway, local paths, the
    controller's PATH), so the tests see what the runner must translate."""
    workspace = root / "ws" / rollout_id
    base = f"{LOCAL_GATEWAY}/rollouts/{rollout_id}"
    fields: dict[str, Any] = dict(
        rollout_id=rollout_id,
        attempt=attempt,
        argv=["python", "agent.py", "--task", str(root / "ws" / "task.json")],
        env={
            "PATH": "/home/me/.venv/bin:/usr/bin",  # copied from the controller's machine
            "HOME": str(root / "ws" / "home"),
            "HARNESSRL_TASK_FILE": str(root / "ws" / "task.json"),
            "OPENAI_API_BASE": f"{base}/v1",
            "OPENAI_BASE_URL": f"{base}/v1",
            "ANTHROPIC_BASE_URL": base,
            "OPENAI_API_KEY": KEY,
            "ANTHROPIC_API_KEY": KEY,
            "HARNESSRL_ROLLOUT_ID": rollout_id,
            "MODEL": "policy",
        },
        task={"prompt": "What is 2+2?"},  # the harness's view: no hidden answer
        files={"agent.py": "print('hi')\n"},
        workspace=workspace,
        cwd=workspace,
        log_dir=root / "logs" / rollout_id,
        timeout_s=120.0,
        limits=ResourceLimits(memory_mb=1024, cpus=0.5),
    )
    fields.update(overrides)
    return Launch(**fields)


def job_manifest(template: dict[str, Any], launch: Launch, **options: Any) -> dict[str, Any]:
    """``manifests.build_job_manifest`` with the names, labels, gateway and deadline the manifest
    tests do not vary; ``options`` add to them or replace them."""
    settings: dict[str, Any] = dict(
        namespace="rl",
        job_name="hrl-x",
        secret_name="hrl-x",
        gateway_url=CLUSTER_GATEWAY,
        labels={},
        active_deadline_s=60,
    )
    return manifests.build_job_manifest(template, launch, **{**settings, **options})


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds (fails the test after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
