"""KubernetesRunner through the official client against the fake API server (tests/fakes).

No cluster runs on dev/CI machines; the fake speaks the documented REST shapes, so these tests
exercise the real client's serialization, error handling and watch streaming.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, KEY, FakeKubernetes

from harnessrl.controller.base import ExitKind
from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.kubernetes.network_policy import build_network_policy
from harnessrl.errors import ConfigError, Conflict, UpstreamError

pytestmark = pytest.mark.anyio

TEMPLATE = {
    "spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1", "workingDir": "/repo"}]}
}
POLICY = {"gateway_port": 8000, "gateway_pod_labels": {"app": "harnessrl-gateway"}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def runners(fake_k8s: FakeKubernetes) -> AsyncIterator[Callable[..., KubernetesRunner]]:
    """Builds runners (each with its own ApiClient, like separate controller processes); closes them."""
    made: list[tuple[KubernetesRunner, ApiClient]] = []

    def make(**options: Any) -> KubernetesRunner:
        api = ApiClient(Configuration(host=fake_k8s.url))
        settings: dict[str, Any] = dict(
            namespace="default",
            gateway_url=CLUSTER_GATEWAY,
            network_policy=POLICY,
            job_template=TEMPLATE,
            run_id="run-1",
            poll_interval_s=0.2,
        )
        settings.update(options)
        runner = KubernetesRunner(api, **settings)
        made.append((runner, api))
        return runner

    yield make
    for runner, api in made:
        await runner.aclose()
        api.close()


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def job_lists(fake: FakeKubernetes) -> int:
    """How many times runners listed the Jobs (once per reconcile pass; watches not counted)."""
    return sum(
        1
        for method, path, query in fake.requests
        if method == "GET" and path.endswith("/jobs") and query.get("watch") != "true"
    )


async def reconcile_passes(fake: FakeKubernetes, n: int = 3) -> None:
    """Wait until the runners have listed the Jobs ``n`` more times: whatever they would do on their
    own, they had the chance to do it by then."""
    start = job_lists(fake)
    await until(lambda: job_lists(fake) >= start + n)


def job_posts(fake: FakeKubernetes) -> int:
    return sum(1 for method, path, _ in fake.requests if method == "POST" and path.endswith("/jobs"))


async def test_launch_creates_secret_job_and_policy(fake_k8s, runners, make_launch) -> None:
    runner = runners()
    handle = await runner.launch(make_launch("r1"))
    job = fake_k8s.job(handle.job_name)
    assert job is not None
    assert job["metadata"]["labels"]["harnessrl/rollout-id"] == "r1"
    assert (
        job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 180
    )  # 120 + 60 startup
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["python", "agent.py"] and container["workingDir"] == "/repo"
    env = {e["name"]: e for e in container["env"]}
    assert env["OPENAI_BASE_URL"]["value"] == f"{CLUSTER_GATEWAY}/rollouts/r1/v1"
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": handle.job_name, "key": "api-key"}
    assert KEY not in json.dumps(job)
    assert fake_k8s.secret_value(handle.job_name, "api-key") == KEY
    secret = fake_k8s.get("secrets", handle.job_name)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # GC'd with the Job
    policy = fake_k8s.get("networkpolicies", "harnessrl-harness-egress")
    assert policy["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    with pytest.raises(Conflict):
        await runner.launch(make_launch("r1"))


@pytest.mark.parametrize(
    ("drive", "kind", "code"),
    [
        (lambda fake, name: fake.succeed_job(name), ExitKind.EXITED, 0),
        (lambda fake, name: fake.fail_job(name, exit_code=3), ExitKind.EXITED, 3),
        (lambda fake, name: fake.oom_job(name), ExitKind.OOM, 137),
        (lambda fake, name: fake.exceed_deadline(name), ExitKind.TIMEOUT, None),
        (lambda fake, name: fake.evict(name), ExitKind.INFRA, None),
        (lambda fake, name: fake.set_waiting(name, "InvalidImageName"), ExitKind.INFRA, None),
        (lambda fake, name: fake.delete_job(name), ExitKind.INFRA, None),
    ],
    ids=["succeeded", "exit-code", "oom", "deadline", "evicted", "bad-image", "deleted-externally"],
)
async def test_outcomes(fake_k8s, runners, make_launch, drive, kind, code) -> None:
    runner = runners()
    handle = await runner.launch(make_launch("r1"))
    drive(fake_k8s, handle.job_name)
    exit_ = await asyncio.wait_for(handle.wait(), 5)
    assert (exit_.kind, exit_.exit_code) == (kind, code), exit_
    await until(lambda: fake_k8s.get("secrets", handle.job_name) is None)  # the key is gone once it ended


async def test_pod_log_saved_before_wait_returns(fake_k8s, runners, make_launch) -> None:
    runner = runners()
    launch = make_launch("r1")
    handle = await runner.launch(launch)
    fake_k8s.write_log(handle.job_name, "thinking...\nFINAL ANSWER: 4\n")
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 5)).exit_code == 0
    assert (launch.log_dir / "stdout.log").read_text() == "thinking...\nFINAL ANSWER: 4\n"
    logs = [q for m, p, q in fake_k8s.requests if p.endswith("/log")]
    assert logs == [{"container": "harness", "limitBytes": str(10 * 1024 * 1024)}]


async def test_stuck_image_pull_is_infra_and_deleted(fake_k8s, runners, make_launch) -> None:
    runner = runners(stuck_pending_s=60)
    handle = await runner.launch(make_launch("r1"))
    fake_k8s.set_waiting(handle.job_name, "ImagePullBackOff", "Back-off pulling image")
    await reconcile_passes(fake_k8s)
    assert not handle._attempt.done.done()  # a fresh pull may still succeed
    fake_k8s.set_job_age(handle.job_name, 120)
    exit_ = await asyncio.wait_for(handle.wait(), 5)
    assert exit_.kind is ExitKind.INFRA and "ImagePullBackOff" in exit_.detail
    await until(lambda: fake_k8s.job(handle.job_name) is None)  # Kubernetes would wait for the deadline


async def test_kill_deletes_job_in_background(fake_k8s, runners, make_launch) -> None:
    runner = runners()
    handle = await runner.launch(make_launch("r1"))
    await handle.kill()
    assert fake_k8s.job(handle.job_name) is None and fake_k8s.get("secrets", handle.job_name) is None
    assert fake_k8s.list("pods") == []
    deletes = [q for m, p, q in fake_k8s.requests if m == "DELETE" and p.endswith(f"/jobs/{handle.job_name}")]
    assert deletes == [{"propagationPolicy": "Background"}]
    exit_ = await handle.wait()
    assert exit_.kind is ExitKind.CANCELLED
    await handle.kill(ExitKind.TIMEOUT)  # killing an ended attempt changes nothing
    assert (await handle.wait()).kind is ExitKind.CANCELLED


async def test_aclose_kills_running_jobs(fake_k8s, runners, make_launch) -> None:
    runner = runners()
    handles = [await runner.launch(make_launch(f"r{i}")) for i in range(3)]
    await runner.aclose()
    assert fake_k8s.jobs() == []
    assert {(await h.wait()).kind for h in handles} == {ExitKind.CANCELLED}


async def test_restarted_controller_adopts_jobs_without_duplicates(fake_k8s, runners, make_launch) -> None:
    first = runners()
    old = [await first.launch(make_launch(f"r{i}")) for i in range(2)]
    await first.aclose(kill_running=False)  # a controller that went away and left its Jobs running
    assert len(fake_k8s.jobs()) == 2 and job_posts(fake_k8s) == 2
    fake_k8s.succeed_job(old[0].job_name)  # one finished while no controller was watching

    second = runners()
    new = [await second.launch(make_launch(f"r{i}")) for i in range(2)]
    assert [h.job_name for h in new] == [h.job_name for h in old]
    assert job_posts(fake_k8s) == 2 and len(fake_k8s.jobs()) == 2  # nothing created again
    assert (await asyncio.wait_for(new[0].wait(), 5)).exit_code == 0
    fake_k8s.fail_job(new[1].job_name, exit_code=2)
    assert (await asyncio.wait_for(new[1].wait(), 5)).exit_code == 2


async def test_restarted_controller_deletes_orphans_after_grace(fake_k8s, runners, make_launch) -> None:
    first = runners()
    left = await first.launch(make_launch("abandoned"))
    await first.aclose(kill_running=False)
    second = runners(orphan_grace_s=0.3)
    kept = await second.launch(make_launch("r-new"))
    await until(lambda: fake_k8s.job(left.job_name) is None)
    assert fake_k8s.job(kept.job_name) is not None
    other_run = runners(run_id="run-2", orphan_grace_s=0)  # another run's runner never touches run-1's Jobs
    await other_run.start()
    await reconcile_passes(fake_k8s)
    assert fake_k8s.job(kept.job_name) is not None


async def test_concurrency_cap(fake_k8s, runners, make_launch) -> None:
    runner = runners(max_concurrent_jobs=2)
    launches = [asyncio.create_task(runner.launch(make_launch(f"r{i}"))) for i in range(4)]
    await until(lambda: sum(t.done() for t in launches) == 2)
    await reconcile_passes(fake_k8s)  # still only two
    assert len(fake_k8s.jobs()) == 2 and sum(t.done() for t in launches) == 2
    first = next(t for t in launches if t.done()).result()
    fake_k8s.succeed_job(first.job_name)
    await until(lambda: sum(t.done() for t in launches) == 3)
    active = [j for j in fake_k8s.jobs() if j["status"].get("active")]
    assert len(active) == 2
    waiting = next(t for t in launches if not t.done())
    waiting.cancel()  # a launch cancelled while queued leaves nothing behind
    await asyncio.gather(waiting, return_exceptions=True)
    await reconcile_passes(fake_k8s)
    assert len(fake_k8s.jobs()) == 3


async def test_watch_recovers_from_expired_resource_version(fake_k8s, runners, make_launch) -> None:
    runner = runners(watch_timeout_s=1, poll_interval_s=30)  # only the watch can deliver the outcome
    handle = await runner.launch(make_launch("r1"))
    fake_k8s.compact()

    def watches() -> int:
        return sum(1 for _, _, q in fake_k8s.requests if q.get("watch") == "true")

    # The watch reconnects from a compacted version (410), relists and watches again: a later watch.
    await until(lambda: watches() >= 2, timeout=10)
    fake_k8s.fail_job(handle.job_name, exit_code=5)
    exit_ = await asyncio.wait_for(handle.wait(), 5)
    assert exit_.exit_code == 5
    assert watches() >= 2


async def test_network_policy_converges(fake_k8s, runners) -> None:
    """A policy left by another config is replaced by this runner's allow-list."""
    stale = build_network_policy("default", gateway_port=9999, gateway_cidr="10.1.2.3/32")
    seeder = runners(network_policy={"gateway_port": 9999, "gateway_cidr": "10.1.2.3/32"})
    await seeder.start()
    assert fake_k8s.get("networkpolicies", stale["metadata"]["name"])["spec"] == stale["spec"]
    runner = runners()
    await runner.start()
    spec = fake_k8s.get("networkpolicies", "harnessrl-harness-egress")["spec"]
    assert spec["egress"][0]["to"] == [{"podSelector": {"matchLabels": {"app": "harnessrl-gateway"}}}]


def test_bad_config_fails_before_any_rollout() -> None:
    with pytest.raises(ConfigError, match="job_template"):
        KubernetesRunner(
            ApiClient(Configuration(host="http://127.0.0.1:9")),
            gateway_url=CLUSTER_GATEWAY,
            network_policy=None,
            job_template={"spec": {"containers": [{"name": "h", "imag": "x"}]}},
        )
    with pytest.raises(ConfigError, match="network_policy"):
        KubernetesRunner(ApiClient(Configuration(host="http://127.0.0.1:9")), gateway_url=CLUSTER_GATEWAY)
    with pytest.raises(ConfigError):
        KubernetesRunner(
            ApiClient(Configuration(host="http://127.0.0.1:9")),
            gateway_url=CLUSTER_GATEWAY,
            network_policy={"gateway_port": 1},
        )


async def test_unreachable_api_and_closed_runner(fake_k8s, runners, make_launch) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    api = ApiClient(Configuration(host=dead))
    try:
        runner = KubernetesRunner(
            api, gateway_url=CLUSTER_GATEWAY, network_policy=POLICY, job_template=TEMPLATE
        )
        with pytest.raises(UpstreamError):
            await runner.launch(make_launch("r1"))
        await runner.aclose()
    finally:
        api.close()
    closed = runners()
    await closed.aclose()
    with pytest.raises(Conflict):
        await closed.launch(make_launch("r1"))


async def test_api_rejection_fails_the_launch(fake_k8s, runners, make_launch) -> None:
    labels = {"team": "not a valid label value"}  # the client does not check; the API server does
    runner = runners(
        job_template={"kind": "Job", "metadata": {"labels": labels}, "spec": {"template": TEMPLATE}}
    )
    with pytest.raises(ConfigError, match="422"):
        await runner.launch(make_launch("r1"))
    assert fake_k8s.jobs() == [] and fake_k8s.list("secrets") == []
    with pytest.raises(ConfigError):
        runners(name_prefix="Not-A-Label-" * 3)
