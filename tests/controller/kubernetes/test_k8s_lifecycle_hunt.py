"""KubernetesRunner life cycle against the fake API: Jobs of another store's rollout under the same
name, deletes the API refuses for a moment at shutdown, and a first list the API refuses."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable

import pytest
from kubernetes.client import ApiClient, Configuration
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, KEY, FakeKubernetes, until

from harnessrl.controller.base import ExitKind
from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.kubernetes.names import RUN_LABEL
from harnessrl.errors import ConfigError, UpstreamError

pytestmark = pytest.mark.anyio

TEMPLATE = {"spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1"}]}}
OTHER_KEY = "hrl-rk-another-store-ffffffffffff"


@pytest.fixture
def runners(make_runner: Callable[..., KubernetesRunner]) -> Callable[..., KubernetesRunner]:
    return functools.partial(make_runner, namespace="default", job_template=TEMPLATE, run_id="exp")


def with_key(launch, key: str, **overrides):
    env = {**launch.env, "OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key}
    return dataclasses.replace(launch, env=env, **overrides)


async def finished_job_of_a_first_run(fake_k8s: FakeKubernetes, runners, make_launch) -> str:
    """A run's rollout 'g0-r0' whose Job succeeded, printing its answer; its controller gone."""
    first = runners()
    handle = await first.launch(make_launch("g0-r0", task={"prompt": "first run's task"}))
    fake_k8s.write_log(handle.job_name, "ANSWER: 4 (the first run's harness)\n")
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0
    await first.aclose(kill_running=False)
    return handle.job_name


@pytest.mark.parametrize("same_key", [True, False])
async def test_a_job_of_another_stores_rollout_is_never_adopted(
    fake_k8s, runners, make_launch, tmp_path, same_key
) -> None:
    """Bug: a run started afresh (a new store, the same run id and rollout ids: the trainer's ids are
    deterministic) adopted the first run's finished Job of the same name, and recorded its exit and
    its log (the first run's answer) as the new attempt's. A Job with the attempt's own key (a
    restarted controller of the same store) is still adopted."""
    name = await finished_job_of_a_first_run(fake_k8s, runners, make_launch)
    second = runners()
    launch = make_launch("g0-r0", task={"prompt": "second run's task"}, log_dir=tmp_path / "second")
    if not same_key:
        launch = with_key(launch, OTHER_KEY)
    if same_key:
        handle = await asyncio.wait_for(second.launch(launch), 60)
        assert handle.job_name == name
        assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0
        assert "ANSWER: 4" in (tmp_path / "second" / "stdout.log").read_text()  # its own log, adopted
        return
    with pytest.raises(ConfigError, match="kubernetes.run_id"):
        await asyncio.wait_for(second.launch(launch), 60)
    assert not (tmp_path / "second" / "stdout.log").exists()
    assert [j["metadata"]["name"] for j in fake_k8s.jobs()] == [name]  # left alone


async def test_a_job_the_list_did_not_show_is_checked_before_its_secret_is_rewritten(
    fake_k8s, runners, make_launch, tmp_path
) -> None:
    """The same through the create: another store's Job (still running, its pod maybe not started)
    that appears only when the create runs into it (409). Its Secret keeps its own key and task
    (rewriting it would hand that pod this attempt's key), and the launch fails naming the field."""
    first = runners()
    left = await first.launch(make_launch("g0-r0", task={"prompt": "first run's task"}))
    await first.aclose(kill_running=False)
    name = left.job_name
    with fake_k8s._lock:  # out of the run's selector: only the create meets it, as in a race
        for resource in ("jobs", "secrets"):
            fake_k8s._objects[resource][("default", name)]["metadata"]["labels"][RUN_LABEL] = "elsewhere"
    second = runners()
    launch = with_key(make_launch("g0-r0", log_dir=tmp_path / "second"), OTHER_KEY)
    with pytest.raises(ConfigError, match="kubernetes.run_id"):
        await asyncio.wait_for(second.launch(launch), 60)
    assert fake_k8s.secret_value(name, "api-key") == KEY
    assert "first run's task" in fake_k8s.secret_value(name, "task.json")
    assert fake_k8s.job(name) is not None


@pytest.mark.parametrize("code", [500, 503, 429])
async def test_aclose_deletes_running_jobs_through_a_moments_api_error(
    fake_k8s, runners, make_launch, code
) -> None:
    """Bug: a stopped controller (SIGTERM -> aclose) whose Job delete met one 5xx/429 left that Job
    running to its deadline (no reconcile pass is left to sweep it), and its Secret with it."""
    runner = runners()
    handles = [await runner.launch(make_launch(f"r{i}")) for i in range(2)]
    fake_k8s.add_fault(
        "DELETE", "jobs", code=code, reason="InternalError", message="etcdserver: leader changed"
    )
    fake_k8s.add_fault("DELETE", "secrets", code=code, reason="InternalError", message="etcdserver: timeout")
    await runner.aclose()
    assert fake_k8s.jobs() == [] and fake_k8s.list("secrets") == []
    assert {(await h.wait()).kind for h in handles} == {ExitKind.CANCELLED}


async def test_a_delete_the_api_keeps_refusing_is_given_up(fake_k8s, runners, make_launch) -> None:
    """The retries are bounded: a kill whose delete keeps failing raises, after deleting the Secret."""
    runner = runners()
    handle = await runner.launch(make_launch("r1"))
    fake_k8s.add_fault("DELETE", "jobs", code=500, reason="InternalError", times=1000)
    with pytest.raises(Exception, match="500"):
        await handle.kill()
    assert fake_k8s.job(handle.job_name) is not None and fake_k8s.get("secrets", handle.job_name) is None
    fake_k8s._faults.clear()


@pytest.mark.parametrize("resource", ["pods", "jobs", "secrets"])
async def test_a_first_list_without_rbac_is_a_config_error(fake_k8s, runners, make_launch, resource) -> None:
    """Bug: a service account that may not list the run's pods (or Jobs, Secrets) made every launch
    raise the client's bare ``ForbiddenException`` (a traceback, not a clear error)."""
    fake_k8s.add_fault(
        "GET", resource, code=403, reason="Forbidden", message=f"{resource} is forbidden", times=1000
    )
    with pytest.raises(ConfigError, match=f"{resource} is forbidden.*RBAC"):
        await asyncio.wait_for(runners().launch(make_launch("r1")), 60)
    fake_k8s._faults.clear()


async def test_a_first_list_refused_for_a_moment_is_an_upstream_error(fake_k8s, runners, make_launch) -> None:
    fake_k8s.add_fault("GET", "jobs", code=500, reason="InternalError", message="etcdserver: timeout")
    runner = runners()
    with pytest.raises(UpstreamError, match="etcdserver: timeout"):
        await asyncio.wait_for(runner.launch(make_launch("r1")), 60)
    handle = await asyncio.wait_for(runner.launch(make_launch("r1")), 60)  # the next launch starts it
    await until(lambda: fake_k8s.job(handle.job_name) is not None)


def job_posts(fake: FakeKubernetes) -> int:
    return sum(1 for method, path, _ in fake.requests if method == "POST" and path.endswith("/jobs"))


async def test_a_create_the_api_only_errs_on_fails_the_launch_after_stuck_pending_s(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: a create answered 500 every time (an admission webhook that is down: "failed calling
    webhook") was retried forever; the launch never returned and no error said why. Past
    ``stuck_pending_s`` of such refusals it fails as an infrastructure failure (``UpstreamError``),
    its Secret deleted."""
    webhook = 'Internal error occurred: failed calling webhook "validate.example.com": connection refused'
    fake_k8s.add_fault("POST", "jobs", code=500, reason="InternalError", message=webhook, times=10_000)
    runner = runners(stuck_pending_s=1.0)
    with pytest.raises(UpstreamError, match="failed calling webhook"):
        await asyncio.wait_for(runner.launch(make_launch("r1")), 60)
    assert job_posts(fake_k8s) >= 2 and fake_k8s.jobs() == []
    assert fake_k8s.list("secrets") == []
    fake_k8s._faults.clear()


async def test_a_create_refused_for_a_moment_still_waits(fake_k8s, runners, make_launch) -> None:
    """The control: a few 503s (shorter than stuck_pending_s) are waited out, as before."""
    fake_k8s.add_fault("POST", "jobs", code=503, reason="ServiceUnavailable", times=3)
    runner = runners(stuck_pending_s=300.0)
    handle = await asyncio.wait_for(runner.launch(make_launch("r1")), 60)
    assert job_posts(fake_k8s) == 4 and fake_k8s.job(handle.job_name) is not None


@pytest.mark.parametrize(
    ("ran_s", "exit_code", "kind", "code"),
    [(100, 0, ExitKind.TIMEOUT, None), (100, 3, ExitKind.TIMEOUT, None), (30, 0, ExitKind.EXITED, 0)],
)
async def test_a_harness_that_ends_past_its_timeout_is_a_timeout(
    fake_k8s, runners, make_launch, ran_s, exit_code, kind, code
) -> None:
    """Bug: the Job's deadline is timeout_s + startup_allowance_s, so a harness that started at once
    ran on into the allowance, and one that ended well there (exit 0 after 100 s of a 60 s
    timeout_s) was recorded as a success, where the local runner kills it at timeout_s. Now a
    harness that ran past its timeout_s is a TIMEOUT however it ended; one within it keeps its exit."""
    runner = runners(startup_allowance_s=60)
    handle = await runner.launch(make_launch("r1", timeout_s=60.0))
    fake_k8s.set_running_for(handle.job_name, ran_s)
    if exit_code == 0:
        fake_k8s.succeed_job(handle.job_name)
    else:
        fake_k8s.fail_job(handle.job_name, exit_code=exit_code)
    exit_ = await asyncio.wait_for(handle.wait(), 60)
    assert (exit_.kind, exit_.exit_code) == (kind, code), exit_


# A Job as `kubectl get job -o yaml` prints it: what the API server generated for it included.
LIVE_JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "agent-sample", "uid": "4f0c…", "resourceVersion": "812"},
    "spec": {
        "manualSelector": False,
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "4f0c-old"}},
        "template": {
            "metadata": {
                "labels": {
                    "app": "agent",
                    "batch.kubernetes.io/controller-uid": "4f0c-old",
                    "batch.kubernetes.io/job-name": "agent-sample",
                    "controller-uid": "4f0c-old",
                    "job-name": "agent-sample",
                }
            },
            "spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1"}]},
        },
    },
    "status": {"succeeded": 1},
}


async def test_a_template_copied_from_a_live_job_launches(fake_k8s, make_runner, make_launch) -> None:
    """Bug: the docs say a template's runtime fields are dropped, but a Job copied from a live one
    kept the selector and the pod labels the API server had generated for it (its uid, its name):
    the API refuses such a Job (422 "`selector` not auto-generated"), every launch in turn."""
    runner = make_runner(namespace="default", job_template=LIVE_JOB)
    handle = await asyncio.wait_for(runner.launch(make_launch("r1")), 60)
    job = fake_k8s.job(handle.job_name)
    assert "selector" not in job["spec"] and job["spec"]["template"]["metadata"]["labels"]["app"] == "agent"
    fake_k8s.succeed_job(handle.job_name)
    assert (await asyncio.wait_for(handle.wait(), 60)).exit_code == 0


def test_a_manual_selector_is_refused_naming_the_field() -> None:
    """One template makes every attempt's Job: a manual selector would match all their pods (each
    Job would count the others' pods as its own). Refused when the config loads."""
    template = {
        "spec": {
            "manualSelector": True,
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "h"}]}},
        }
    }
    api = ApiClient(Configuration(host="http://127.0.0.1:9"))  # never called
    try:
        with pytest.raises(ConfigError, match="job_template.spec.manualSelector"):
            KubernetesRunner(api, gateway_url=CLUSTER_GATEWAY, network_policy=None, job_template=template)
    finally:
        api.close()


async def test_a_launch_fails_once_the_api_has_refused_every_pass_for_stuck_pending_s(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: only a reconcile pass creates Jobs, and a pass starts with lists; an API that refused
    them all (every request a 5xx, expired credentials: 401) left each new launch waiting forever,
    with the controller's slot. The bound on creates the API refuses (stuck_pending_s) never came
    into play: no create was ever tried. An attempt whose Job exists runs on."""
    runner = runners(stuck_pending_s=0.5)
    running = await runner.launch(make_launch("r1"))
    fake_k8s.add_fault("GET", "pods", code=500, reason="InternalError", message="etcd down", times=10**6)
    with pytest.raises(UpstreamError, match="stuck_pending_s"):
        await asyncio.wait_for(runner.launch(make_launch("r2")), 30)
    assert fake_k8s.job(running.job_name) is not None
    fake_k8s.clear_faults()
    fake_k8s.succeed_job(running.job_name)
    exit_ = await asyncio.wait_for(running.wait(), 60)
    assert (exit_.kind, exit_.exit_code) == (ExitKind.EXITED, 0)  # its own outcome, not failed with r2


async def test_a_launch_whose_creates_all_time_out_fails_after_stuck_pending_s(
    fake_k8s, runners, make_launch
) -> None:
    """Bug: a create the API never answered in request_timeout_s (a slow admission webhook, an
    overloaded server) raised no ApiException, so it was neither counted toward stuck_pending_s nor
    backed off: tried again at every pass, the launch waited forever."""
    runner = runners(stuck_pending_s=0.5, request_timeout_s=0.3)
    await runner.start()
    fake_k8s.add_fault("POST", "jobs", code=504, reason="Timeout", delay_s=1.0, times=10**6)
    with pytest.raises(UpstreamError, match="stuck_pending_s"):
        await asyncio.wait_for(runner.launch(make_launch("r1")), 30)
    assert fake_k8s.jobs() == []
