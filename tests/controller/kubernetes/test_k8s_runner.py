"""KubernetesRunner through the official client against the fake API server (tests/fakes).

No cluster runs on dev/CI machines; the fake speaks the documented REST shapes, so these tests
exercise the real client's serialization, error handling and watch streaming.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import socket
import time
from collections.abc import Callable

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api, NetworkingV1Api
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, KEY, POLICY, FakeKubernetes, until

from harnessrl.controller.base import ExitKind
from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.kubernetes.names import attempt_labels, resource_name
from harnessrl.controller.kubernetes.network_policy import build_network_policy, run_policy_name
from harnessrl.errors import ConfigError, Conflict, UpstreamError

pytestmark = pytest.mark.anyio

TEMPLATE = {
    "spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1", "workingDir": "/repo"}]}
}


@pytest.fixture
def runners(make_runner: Callable[..., KubernetesRunner]) -> Callable[..., KubernetesRunner]:
    """Builds runners of run-1 (each with its own ApiClient, like separate controller processes)."""
    return functools.partial(make_runner, namespace="default", job_template=TEMPLATE, run_id="run-1")


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
    policy = fake_k8s.get("networkpolicies", run_policy_name("harnessrl-harness-egress", "run-1"))
    assert policy["spec"]["egress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    baseline = fake_k8s.get("networkpolicies", "harnessrl-harness-egress")["spec"]
    assert baseline["policyTypes"] == ["Ingress", "Egress"] and "egress" not in baseline  # shut: []
    with pytest.raises(Conflict):
        await runner.launch(make_launch("r1"))


@pytest.mark.parametrize(
    ("drive", "kind", "code"),
    [
        (lambda fake, name: fake.succeed_job(name), ExitKind.EXITED, 0),
        (lambda fake, name: fake.fail_job(name, exit_code=3), ExitKind.EXITED, 3),
        (lambda fake, name: fake.oom_job(name), ExitKind.OOM, 137),
        (lambda fake, name: fake.exceed_deadline(name, keep_pods=True), ExitKind.TIMEOUT, None),
        (lambda fake, name: fake.evict(name), ExitKind.INFRA, None),
        (
            lambda fake, name: fake.evict(
                name, 'Container harness exceeded its local ephemeral storage limit "10Gi". '
            ),
            ExitKind.RESOURCE_LIMIT,
            None,
        ),
        (lambda fake, name: fake.set_waiting(name, "InvalidImageName"), ExitKind.INFRA, None),
        (lambda fake, name: fake.delete_job(name), ExitKind.INFRA, None),
    ],
    ids=[
        "succeeded",
        "exit-code",
        "oom",
        "deadline",
        "evicted",
        "evicted-own-disk",
        "bad-image",
        "deleted-externally",
    ],
)
async def test_outcomes(fake_k8s, runners, make_launch, drive, kind, code) -> None:
    runner = runners()
    handle = await runner.launch(make_launch("r1"))
    drive(fake_k8s, handle.job_name)
    exit_ = await asyncio.wait_for(handle.wait(), 60)
    assert (exit_.kind, exit_.exit_code) == (kind, code), exit_
    await until(lambda: fake_k8s.get("secrets", handle.job_name) is None)  # the key is gone once it ended


async def test_pod_log_saved_before_wait_returns(fake_k8s, runners, make_launch) -> None:
    runner = runners()
    launch = make_launch("r1")
    handle = await runner.launch(launch)
    fake_k8s.write_log(handle.job_name, "thinking...\nFINAL ANSWER: 4\n")
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0
    assert (launch.log_dir / "stdout.log").read_text() == "thinking...\nFINAL ANSWER: 4\n"
    logs = [q for m, p, q in fake_k8s.requests if p.endswith("/log")]
    assert logs == [{"container": "harness"}]


async def test_a_long_pod_log_keeps_its_end(fake_k8s, runners, make_launch) -> None:
    """The log past ``max_log_bytes`` keeps its last bytes, where the answer (and a failing harness's
    reason) is: ``limitBytes`` kept the head, and an evaluator reading stdout scored the answer lost."""
    runner = runners(max_log_bytes=64)
    launch = make_launch("r1")
    handle = await runner.launch(launch)
    log = "".join(f"step {i}: thinking...\n" for i in range(20_000)) + "FINAL ANSWER: 4\n"
    fake_k8s.write_log(handle.job_name, log)
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0
    assert (launch.log_dir / "stdout.log").read_text() == log[-64:]
    assert log[-64:].endswith("FINAL ANSWER: 4\n")  # the control: what is kept is the end


async def test_stuck_image_pull_is_infra_and_deleted(fake_k8s, runners, make_launch) -> None:
    runner = runners(stuck_pending_s=60)
    handle = await runner.launch(make_launch("r1"))
    fake_k8s.set_waiting(handle.job_name, "ImagePullBackOff", "Back-off pulling image")
    await reconcile_passes(fake_k8s)
    assert not handle._attempt.done.done()  # a fresh pull may still succeed
    fake_k8s.set_job_age(handle.job_name, 120)
    exit_ = await asyncio.wait_for(handle.wait(), 60)
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
    assert (await asyncio.wait_for(new[0].wait(), 60)).exit_code == 0
    fake_k8s.fail_job(new[1].job_name, exit_code=2)
    assert (await asyncio.wait_for(new[1].wait(), 60)).exit_code == 2


async def test_restarted_controller_deletes_superseded_attempts(fake_k8s, runners, make_launch) -> None:
    first = runners()
    left = await first.launch(make_launch("abandoned"))
    unclaimed = await first.launch(make_launch("unclaimed"))
    await first.aclose(kill_running=False)  # it went away; the store requeued "abandoned" as attempt 1
    second = runners(orphan_grace_s=0.3)
    retry = await second.launch(make_launch("abandoned", attempt=1))
    await until(lambda: fake_k8s.job(left.job_name) is None)  # superseded: nobody can finish it
    await reconcile_passes(fake_k8s)
    # Not this runner's and not superseded: maybe another live controller's; left to its deadline.
    assert fake_k8s.job(unclaimed.job_name) is not None and fake_k8s.job(retry.job_name) is not None
    other_run = runners(run_id="run-2", orphan_grace_s=0)  # another run's runner never touches run-1's Jobs
    await other_run.start()
    await other_run.launch(make_launch("abandoned", attempt=2))
    await reconcile_passes(fake_k8s)
    assert fake_k8s.job(retry.job_name) is not None


async def test_two_runs_without_a_run_id_never_touch_each_others_jobs(
    fake_k8s, make_runner, make_launch
) -> None:
    """Bug: ``kubernetes.run_id`` defaulted to "default", so two runs in one namespace that left it
    out shared Job names and labels: the trainer's rollout ids are deterministic, so the second run's
    runner deleted the first run's running Job as an attempt its own retry superseded, and refused
    to launch a rollout whose first attempt the other run had made (another key)."""
    first, second = (
        make_runner(namespace="default", job_template=TEMPLATE, orphan_grace_s=0) for _ in range(2)
    )
    mine = await first.launch(make_launch("r1"))
    await second.launch(make_launch("r1", attempt=1))  # the other run is one retry further
    theirs = await second.launch(make_launch("r1"))  # its own first attempt of the same rollout id
    assert theirs.job_name != mine.job_name
    await reconcile_passes(fake_k8s)
    assert fake_k8s.job(mine.job_name) is not None
    fake_k8s.succeed_job(mine.job_name)
    fake_k8s.succeed_job(theirs.job_name)
    for handle in (mine, theirs):
        exit_ = await asyncio.wait_for(handle.wait(), 60)
        assert (exit_.kind, exit_.exit_code) == (ExitKind.EXITED, 0), exit_
    assert first.run_id != second.run_id and first.config.run_id == first.run_id


async def test_two_controllers_sharing_a_run_leave_each_others_jobs_alone(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: every unfinished Job of the run a runner had not launched was its orphan, so two
    controllers on one store (one [kubernetes] section, one run_id) deleted each other's running
    Jobs once the grace was over, and every rollout ended as an infrastructure failure."""
    clock = [time.time()]
    first, second = (runners(orphan_grace_s=1.0, clock=lambda: clock[0]) for _ in range(2))
    one, two = await first.launch(make_launch("r1")), await second.launch(make_launch("r2"))
    clock[0] += 60  # long past the grace
    await reconcile_passes(fake_k8s, 6)
    assert fake_k8s.job(one.job_name) is not None and fake_k8s.job(two.job_name) is not None
    fake_k8s.succeed_job(one.job_name)
    fake_k8s.succeed_job(two.job_name)
    for handle in (one, two):
        exit_ = await asyncio.wait_for(handle.wait(), 60)
        assert (exit_.kind, exit_.exit_code) == (ExitKind.EXITED, 0), exit_


async def test_a_deadline_is_a_timeout_only_for_a_harness_seen_running(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: a Job that never got a pod (quota, admission) reached its deadline (timeout + startup
    allowance, 180 s here) before the 300 s "no pod created" rule, and was the policy's TIMEOUT."""
    runner = runners()
    ran = await runner.launch(make_launch("ran"))
    await reconcile_passes(fake_k8s)  # the runner saw its harness running
    fake_k8s.exceed_deadline(ran.job_name)  # the job controller deletes the pods
    assert (await asyncio.wait_for(ran.wait(), 60)).kind is ExitKind.TIMEOUT
    for start_pods in ("none", "pending"):  # no pod at all; a pull that never ended
        fake_k8s.start_pods = start_pods
        handle = await runner.launch(make_launch(f"never-ran-{start_pods}"))
        await reconcile_passes(fake_k8s)
        fake_k8s.exceed_deadline(handle.job_name)
        exit_ = await asyncio.wait_for(handle.wait(), 60)
        assert exit_.kind is ExitKind.INFRA and "before the harness was seen running" in exit_.detail


async def test_the_pod_has_a_disk_limit(fake_k8s, runners, make_launch) -> None:
    """Bug: no sizeLimit and no ephemeral-storage limit, so an agent could fill the node's disk and be
    evicted by node pressure (INFRA) instead of for its own overrun."""
    runner = runners(ephemeral_storage_limit="5Gi")
    handle = await runner.launch(make_launch("r1"))
    spec = fake_k8s.job(handle.job_name)["spec"]["template"]["spec"]
    resources = spec["containers"][0]["resources"]
    assert resources["limits"]["ephemeral-storage"] == "5Gi"
    assert resources["requests"]["ephemeral-storage"] == "0"  # not the limit: scheduling is unchanged
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name in ("harnessrl-workspace", "harnessrl-home", "harnessrl-tmp"):
        assert volumes[name]["emptyDir"] == {"sizeLimit": "5Gi"}
    with pytest.raises(ConfigError, match="ephemeral_storage_limit"):
        runners(ephemeral_storage_limit="lots")


async def test_a_short_ttl_is_refused() -> None:
    """Bug: with ttl_after_finished_s = 0 the TTL controller deleted a failed Job and its pods before
    the runner read the exit status, so an exit code or OOM became INFRA ("job disappeared")."""
    api = ApiClient(Configuration(host="http://127.0.0.1:9"))
    try:
        for ttl in (0, 59):
            with pytest.raises(ConfigError, match="ttl_after_finished_s"):
                KubernetesRunner(
                    api, gateway_url=CLUSTER_GATEWAY, network_policy=None, ttl_after_finished_s=ttl
                )
        KubernetesRunner(api, gateway_url=CLUSTER_GATEWAY, network_policy=None, ttl_after_finished_s=60)
    finally:
        api.close()


async def test_aclose_leaves_no_job_behind_from_a_create_in_flight(fake_k8s, runners, make_launch) -> None:
    """Bug: aclose() cancelled the pass whose Job create was on its way; the kill found nothing (404)
    and the create landed after it, leaving a Job running with no one to delete it."""
    runner = runners()
    await runner.start()
    fake_k8s.add_fault("POST", "jobs", delay_s=0.5)  # the API server answers the create late
    launching = asyncio.create_task(runner.launch(make_launch("r1")))
    await until(lambda: job_posts(fake_k8s) == 1)
    await runner.aclose()
    await until(lambda: fake_k8s.serving == 0)  # every request answered: nothing more can land
    assert fake_k8s.jobs() == [] and fake_k8s.list("secrets") == []
    handle = (await asyncio.gather(launching, return_exceptions=True))[0]
    assert (await handle.wait()).kind is ExitKind.CANCELLED


async def test_a_full_quota_is_waited_out(fake_k8s, runners, make_launch) -> None:
    """Bug: a 403 "exceeded quota" on create failed the attempt at once (an infra retry spent); a
    full quota frees itself as other Jobs end, like a 429."""
    quota = (
        'jobs.batch "x" is forbidden: exceeded quota: rollouts, requested: count/jobs.batch=1, '
        "used: count/jobs.batch=4, limited: count/jobs.batch=4"
    )
    fake_k8s.add_fault("POST", "jobs", code=403, reason="Forbidden", message=quota, times=2)
    runner = runners()
    handle = await asyncio.wait_for(runner.launch(make_launch("r1")), 10)
    assert job_posts(fake_k8s) == 3
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0
    # A quota that forbids the pod outright is the config's fault: the launch fails at once.
    forbidden = 'jobs.batch "y" is forbidden: failed quota: compute: must specify limits.cpu'
    fake_k8s.add_fault("POST", "jobs", code=403, reason="Forbidden", message=forbidden)
    with pytest.raises(ConfigError, match="403"):
        await asyncio.wait_for(runner.launch(make_launch("r2")), 10)


async def test_a_quota_one_attempt_alone_exceeds_fails_the_launch(fake_k8s, runners, make_launch) -> None:
    """Bug: every "exceeded quota" was waited out, also one whose hard limit is below what a single
    attempt asks for (``requested: count/secrets=1 ... limited: count/secrets=0``): nothing ending
    ever frees that, and the launch waited forever (the controller's slot with it)."""
    never = (
        'secrets "x" is forbidden: exceeded quota: tight, requested: count/secrets=1,secrets=1, '
        "used: count/secrets=0,secrets=0, limited: count/secrets=0,secrets=10"
    )
    fake_k8s.add_fault("POST", "secrets", code=403, reason="Forbidden", message=never, times=1000)
    runner = runners()
    with pytest.raises(ConfigError, match="limited: count/secrets=0"):
        await asyncio.wait_for(runner.launch(make_launch("r1")), 30)


async def test_a_secret_no_job_wants_is_swept_whoever_wrote_it(fake_k8s, runners, make_launch) -> None:
    """Bug: a Secret left by a controller that died between its Secret and its Job carries that
    controller's id, and no other runner ever swept it (docs: swept once orphan_grace_s old). The
    grace counts from the runner's written-at stamp, renewed on every create try."""
    clock = [time.time()]
    quota = 'jobs.batch "x" is forbidden: exceeded quota: rollouts'
    fake_k8s.add_fault("POST", "jobs", code=403, reason="Forbidden", message=quota, times=1)
    runner = runners(clock=lambda: clock[0])
    await runner.start()
    launching = asyncio.create_task(runner.launch(make_launch("r1")))
    await until(lambda: job_posts(fake_k8s) == 1)
    name = resource_name("r1", 0, scope="run-1")
    clock[0] += 30  # the retry rewrites the Secret (409, replaced) with a new stamp
    mine = await asyncio.wait_for(launching, 10)
    assert mine.job_name == name and job_posts(fake_k8s) == 2
    stamp = fake_k8s.get("secrets", name)["metadata"]["annotations"]["harnessrl/written-at"]
    assert float(stamp) == pytest.approx(clock[0], abs=0.01)  # the second try's time

    api = ApiClient(Configuration(host=fake_k8s.url))
    try:  # what a controller that died before creating its Job leaves behind
        labels = attempt_labels("run-1", "r-dead", 0, controller="gone")
        CoreV1Api(api).create_namespaced_secret(
            "default", {"metadata": {"name": "hrl-dead-a0", "labels": labels}, "data": {}}
        )
    finally:
        api.close()
    await reconcile_passes(fake_k8s)
    assert fake_k8s.get("secrets", "hrl-dead-a0") is not None  # young: its Job may be on its way
    clock[0] += 1000
    await until(lambda: fake_k8s.get("secrets", "hrl-dead-a0") is None)
    assert fake_k8s.get("secrets", name) is not None  # its attempt is running: not an orphan


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
    await until(lambda: watches() >= 2, timeout=60)
    fake_k8s.fail_job(handle.job_name, exit_code=5)
    exit_ = await asyncio.wait_for(handle.wait(), 60)
    assert exit_.exit_code == 5
    assert watches() >= 2


async def test_network_policy_converges(fake_k8s, runners) -> None:
    """A run's allow-list left by another config of the run is replaced by this runner's; a
    namespace-wide allow-list under the baseline's name (older harnessrl) becomes the deny-all."""
    name = run_policy_name("harnessrl-harness-egress", "run-1")
    seeder = runners(network_policy={"gateway_port": 9999, "gateway_cidr": "10.1.2.3/32"})
    await seeder.start()
    assert fake_k8s.get("networkpolicies", name)["spec"]["egress"][0]["ports"][0]["port"] == 9999
    api = ApiClient(Configuration(host=fake_k8s.url))
    old_style = build_network_policy("default", gateway_port=9999, gateway_cidr="10.1.2.3/32")
    NetworkingV1Api(api).replace_namespaced_network_policy("harnessrl-harness-egress", "default", old_style)
    api.close()
    runner = runners()
    await runner.start()
    spec = fake_k8s.get("networkpolicies", name)["spec"]
    assert spec["egress"][0]["to"] == [{"podSelector": {"matchLabels": {"app": "harnessrl-gateway"}}}]
    assert "egress" not in fake_k8s.get("networkpolicies", "harnessrl-harness-egress")["spec"]  # []


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


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"spec": {"containers": {"name": "harness"}}}, "job_template.spec.containers"),
        ({"spec": {"containers": ["harness"]}}, "job_template.spec.containers"),
        ({"kind": "Pod", "spec": ["x"]}, "job_template.spec"),
        ({"kind": "Job", "metadata": "x"}, "job_template.metadata"),
        ({"kind": "Job", "spec": {"template": "x"}}, "job_template.spec.template"),
        ({"kind": 3}, "job_template.kind"),
    ],
)
def test_a_malformed_template_is_a_config_error_naming_the_field(template: dict, field: str) -> None:
    """Bug: these raised AttributeError from inside the template code before any validation."""
    api = ApiClient(Configuration(host="http://127.0.0.1:9"))
    try:
        with pytest.raises(ConfigError, match=re.escape(field)):
            KubernetesRunner(api, gateway_url=CLUSTER_GATEWAY, network_policy=None, job_template=template)
    finally:
        api.close()


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
