"""The runner against API answers the happy path does not produce: a 409 for a Job that is gone by
the time it is read, and a log longer than ``max_log_bytes`` whatever the server is asked."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.responses import Response
from tests.controller.kubernetes.k8s_support import FakeKubernetes

from harnessrl.controller.kubernetes import KubernetesRunner

pytestmark = pytest.mark.anyio

TEMPLATE = {"spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1"}]}}


class LogsPastTheLimit(FakeKubernetes):
    """An API server that serves the whole log whatever ``limitBytes`` says (the API documents that
    it "may return slightly more"; a proxy in between may drop the parameter altogether)."""

    async def _serve(self, request, query, namespace, resource, name, log_subresource) -> Any:
        if log_subresource and resource == "pods":
            with self._lock:
                text = self._logs.get((namespace, name or ""), "")
            return Response(text.encode(), media_type="text/plain")
        return await super()._serve(request, query, namespace, resource, name, log_subresource)


@pytest.fixture
def fake_k8s() -> Iterator[FakeKubernetes]:
    with LogsPastTheLimit() as fake:
        yield fake


@pytest.fixture
def runners(make_runner: Callable[..., KubernetesRunner]) -> Callable[..., KubernetesRunner]:
    return functools.partial(make_runner, job_template=TEMPLATE)


async def test_a_job_gone_between_the_409_and_the_read_is_created_again(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: the create's 409 (a predecessor's Job of that name, being deleted) was followed by a
    read that found nothing (404), which failed the launch with a ConfigError; the name is free."""
    runner = runners()
    fake_k8s.add_fault("POST", "jobs", code=409, reason="AlreadyExists", message="jobs.batch exists")
    handle = await asyncio.wait_for(runner.launch(make_launch("r1")), 60)
    assert fake_k8s.job(handle.job_name) is not None
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0


async def test_the_saved_log_never_exceeds_max_log_bytes(fake_k8s, runners, make_launch) -> None:
    runner = runners(max_log_bytes=16)
    launch = make_launch("r1")
    handle = await runner.launch(launch)
    fake_k8s.write_log(handle.job_name, "x" * 1000 + "0123456789abcdef")
    fake_k8s.succeed_job(handle.job_name)
    await asyncio.wait_for(handle.wait(), 60)
    assert (launch.log_dir / "stdout.log").read_bytes() == b"0123456789abcdef"  # its end
