"""The controller driving the Kubernetes runner end to end against the fake API: a queued rollout
becomes a Job, the Job's outcome becomes the rollout's outcome, and the evaluator scores it."""

from __future__ import annotations

import asyncio
import sys

import pytest
from kubernetes.client import ApiClient, Configuration
from tests.controller.kubernetes.k8s_support import FakeKubernetes

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.stack import RolloutConfig
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore

TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "harness", "image": "agent:1"}]}}}}


def test_controller_runs_rollouts_as_jobs(tmp_path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    ok = store.create_rollout(task={"prompt": "fix it"}).rollout_id
    crash = store.create_rollout(task={"prompt": "fix it"}).rollout_id

    async def go():
        with FakeKubernetes() as fake:
            api = ApiClient(Configuration(host=fake.url))
            runner = KubernetesRunner(
                api,
                gateway_url="http://10.96.0.80:8000",
                network_policy={"gateway_port": 8000, "gateway_pod_labels": {"app": "gw"}},
                job_template=TEMPLATE,
                poll_interval_s=0.2,
            )
            controller = Controller(
                store,
                runner,
                gateway=GatewayEndpoint("127.0.0.1", 8000),
                harness=HarnessSpec(command=["agent", "{prompt}"], timeout_s=60),
                evaluator=build_evaluator({"type": "command", "command": ["true"]}),
                run_dir=tmp_path / "run",
                config=ControllerConfig(poll_interval_s=0.1),
            )
            run = asyncio.create_task(controller.run_until_done([ok, crash], timeout_s=30))
            while len(fake.jobs()) < 2:
                await asyncio.sleep(0.05)
            jobs = {j["metadata"]["labels"]["harnessrl/rollout-id"]: j for j in fake.jobs()}
            container = jobs[ok]["spec"]["template"]["spec"]["containers"][0]
            assert container["command"] == ["agent", "fix it"]
            env = {e["name"]: e for e in container["env"]}
            assert env["OPENAI_BASE_URL"]["value"] == f"http://10.96.0.80:8000/rollouts/{ok}/v1"
            assert "secretKeyRef" in env["OPENAI_API_KEY"]["valueFrom"]
            fake.succeed_job(jobs[ok]["metadata"]["name"])
            fake.fail_job(jobs[crash]["metadata"]["name"], exit_code=2)
            done = {r.rollout_id: r for r in await run}
            await controller.shutdown()
            api.close()
            return done

    done = asyncio.run(go())
    assert done[ok].status is RolloutStatus.FINISHED and done[ok].outcome.value == "success"
    assert done[ok].reward == 1.0
    assert done[crash].outcome.value == "policy_failure"


def test_kubernetes_section_skips_the_local_executable_check():
    config = RolloutConfig.model_validate(
        {
            "harness": {"command": ["only-in-the-image", "{prompt}"]},
            "evaluator": {"type": "exact_match"},
            "kubernetes": {"gateway_url": "http://gw:8000", "network_policy": None},
        }
    )
    from harnessrl.controller.stack import prepare

    harness, _ = prepare(config)
    assert harness.command[0] == "only-in-the-image"


def test_a_kubernetes_section_without_the_kubernetes_client_is_refused_naming_it(monkeypatch):
    from harnessrl.controller.stack import prepare
    from harnessrl.errors import ConfigError

    config = RolloutConfig.model_validate(
        {
            "harness": {"command": ["only-in-the-image", "{prompt}"]},
            "evaluator": {"type": "exact_match"},
            "kubernetes": {"gateway_url": "http://gw:8000", "network_policy": None},
        }
    )
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # find_spec reports it missing
    with pytest.raises(ConfigError, match=r"^kubernetes: .*pip install 'harnessrl\[kubernetes\]'"):
        prepare(config)


def k8s_config(**sections) -> RolloutConfig:
    return RolloutConfig.model_validate(
        {
            "harness": {"command": ["only-in-the-image", "{prompt}"]},
            "evaluator": {"type": "exact_match"},
            "kubernetes": {"gateway_url": "http://gw:8000", "network_policy": None},
            **sections,
        }
    )


def test_a_repo_the_pod_would_never_get_is_refused_naming_the_field(tmp_path):
    """Bug: prepare accepted harness.repo (git_history = "squash") with [kubernetes], but only the
    harness files reach the pod: the agent worked on the image's own repo, its whole history
    included (git log --all could find the gold patch)."""
    from harnessrl.controller.stack import prepare
    from harnessrl.errors import ConfigError

    config = k8s_config(harness={"command": ["agent"], "repo": str(tmp_path), "git_history": "squash"})
    with pytest.raises(ConfigError, match=r"^harness\.repo: .*\[kubernetes\]"):
        prepare(config)


def test_a_scorer_of_the_workspace_is_refused_naming_the_field():
    """Bug: a command evaluator with [kubernetes] scored the controller's untouched local workspace
    (the agent's work stayed in the pod): every rollout got the score of doing nothing."""
    from harnessrl.controller.stack import prepare
    from harnessrl.errors import ConfigError

    config = k8s_config(evaluator={"type": "command", "command": ["true"]})
    with pytest.raises(ConfigError, match=r'^evaluator\.type = "command": .*\[kubernetes\]'):
        prepare(config)
    # evaluators of the calls or the log still work there (the pod's log is saved as stdout.log)
    for evaluator in ({"type": "exact_match"}, {"type": "exact_match", "source": "stdout"}):
        prepare(k8s_config(evaluator=evaluator))


def test_a_template_request_above_harness_limits_is_refused_when_the_config_loads():
    """Found only when a Job was built (each launch an infrastructure failure) before: the template's
    cpu request and ``harness.limits.cpus`` sit in two sections, checked together by ``prepare``."""
    from harnessrl.controller.stack import prepare
    from harnessrl.errors import ConfigError

    template = {
        "spec": {"containers": [{"name": "harness", "image": "a:1", "resources": {"requests": {"cpu": "1"}}}]}
    }
    kubernetes = {"gateway_url": "http://gw:8000", "network_policy": None, "job_template": template}
    harness = {"command": ["agent", "{prompt}"], "limits": {"cpus": 0.5}}
    with pytest.raises(ConfigError, match=r"^harness\.limits\.cpus: "):
        prepare(k8s_config(harness=harness, kubernetes=kubernetes))
    prepare(k8s_config(harness={**harness, "limits": {"cpus": 1}}, kubernetes=kubernetes))  # the control
