"""Kubernetes with per-task images (docs/environments.md): the Job runs the task's image, and the harness
is either in it or copied in by an init container from ``harness_image``. The builders are pure
functions tested directly; the controller and runner are tested against the fake API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, Configuration
from tests.controller.kubernetes.k8s_support import (
    CLUSTER_GATEWAY,
    FakeKubernetes,
    build_launch,
    job_manifest,
)

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.controller import Controller, ControllerConfig, GatewayEndpoint
from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.kubernetes import KubernetesRunner, KubernetesRunnerConfig
from harnessrl.controller.kubernetes.config import PodSecurityConfig
from harnessrl.controller.kubernetes.harness_injection import (
    HARNESS_CONTAINER,
    HARNESS_VOLUME,
    inject_harness,
)
from harnessrl.controller.kubernetes.pod_security import SEED_CONTAINER
from harnessrl.errors import ConfigError
from harnessrl.store.sqlite import SQLiteStore

TEMPLATE = {"spec": {"template": {"spec": {"containers": [{"name": "harness", "image": "template:1"}]}}}}
PATHS = ["/opt/harnessrl/.venv", "/root/.pyenv/versions/3.11.7"]


def job_for(tmp_path: Path, **launch: object) -> dict:
    return job_manifest(
        TEMPLATE,
        build_launch(tmp_path, **launch),
        image="configured:1",
        harness_image="registry.local/harnessrl/runtime:1",
        harness_paths=PATHS,
    )


def test_the_job_runs_the_tasks_image_and_the_harness_is_copied_in(tmp_path: Path):
    job = job_for(tmp_path, image="registry.local/swe/toolz:abc")
    pod = job["spec"]["template"]["spec"]
    [harness] = pod["containers"]
    assert harness["image"] == "registry.local/swe/toolz:abc"  # the task's, over config and template
    inits = {c["name"]: c for c in pod["initContainers"]}
    assert (
        inits[SEED_CONTAINER]["image"] == "registry.local/swe/toolz:abc"
    )  # seeds the task image's workspace
    copier = inits[HARNESS_CONTAINER]
    assert copier["image"] == "registry.local/harnessrl/runtime:1"
    assert copier["command"][-2:] == PATHS and copier["command"][:2] == ["sh", "-c"]
    assert copier["securityContext"]["runAsNonRoot"] and copier["securityContext"]["capabilities"] == {
        "drop": ["ALL"]
    }
    assert copier["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": HARNESS_VOLUME, "emptyDir": {}} in pod["volumes"]
    mounts = {m["mountPath"]: m for m in harness["volumeMounts"]}
    for i, path in enumerate(PATHS):  # read-only, at the paths the harness was installed at
        assert mounts[path] == {
            "name": HARNESS_VOLUME,
            "mountPath": path,
            "subPath": str(i),
            "readOnly": True,
        }
    assert harness["securityContext"]["readOnlyRootFilesystem"] is True  # the task image stays read-only


def test_without_a_task_image_nothing_is_injected(tmp_path: Path):
    # The control: a task on the host environment keeps the configured image and gets no copier.
    job = job_for(tmp_path)
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "configured:1"
    assert HARNESS_CONTAINER not in {c["name"] for c in pod.get("initContainers") or []}
    assert HARNESS_VOLUME not in {v["name"] for v in pod["volumes"]}


def test_injection_settings_are_checked():
    base = {"gateway_url": CLUSTER_GATEWAY, "network_policy": None}
    with pytest.raises(ValueError, match="harness_image needs harness_paths"):
        KubernetesRunnerConfig(**base, harness_image="runtime:1")
    with pytest.raises(ValueError, match="must be an absolute folder"):
        KubernetesRunnerConfig(**base, harness_image="runtime:1", harness_paths=["relative/venv"])


@pytest.mark.parametrize("path", ["/opt/..", "/opt/venv/../..", "//", "/."])
def test_a_harness_path_that_is_the_root_is_refused_when_the_config_loads(path: str):
    """Bug: ``/opt/..`` passed the config (not normalised) and raised a bare ValueError in
    inject_harness at launch, which the controller does not catch: the rollout stayed running."""
    base = {"gateway_url": CLUSTER_GATEWAY, "network_policy": None, "harness_image": "runtime:1"}
    with pytest.raises(ValueError, match="harness_paths"):
        KubernetesRunnerConfig(**base, harness_paths=[path])
    with pytest.raises(ConfigError, match="harness_paths"):  # a HarnessRLError: the controller's infra path
        inject_harness({}, {}, harness_image="runtime:1", paths=[path], security=PodSecurityConfig())


def test_harness_paths_are_normalised():
    base = {"gateway_url": CLUSTER_GATEWAY, "network_policy": None, "harness_image": "runtime:1"}
    config = KubernetesRunnerConfig(**base, harness_paths=["/opt/venv/", "/opt/./py/../python3.11"])
    assert config.harness_paths == ["/opt/venv", "/opt/python3.11"]
    with pytest.raises(ValueError, match="twice"):
        KubernetesRunnerConfig(**base, harness_paths=["/opt/venv", "/opt/venv/"])


def test_the_controller_gives_each_job_its_tasks_image(tmp_path: Path):
    store = SQLiteStore(tmp_path / "db.sqlite")
    toolz = store.create_rollout(
        task={"prompt": "fix", "image_name": "registry.local/swe/toolz:1"}
    ).rollout_id
    host = store.create_rollout(task={"prompt": "fix"}).rollout_id
    harness = HarnessSpec(
        command=["/opt/harnessrl/.venv/bin/mini", "{prompt}"],
        timeout_s=60,
        environment={"field": "image_name", "harness": "host"},
    )

    async def go() -> tuple[dict, dict]:
        with FakeKubernetes() as fake:
            api = ApiClient(Configuration(host=fake.url))
            runner = KubernetesRunner(
                api,
                gateway_url=CLUSTER_GATEWAY,
                network_policy={"gateway_port": 8000, "gateway_pod_labels": {"app": "gw"}},
                job_template=TEMPLATE,
                harness_image="registry.local/harnessrl/runtime:1",
                harness_paths=PATHS,
                poll_interval_s=0.2,
            )
            controller = Controller(
                store,
                runner,
                gateway=GatewayEndpoint("127.0.0.1", 8000),
                harness=harness,
                evaluator=build_evaluator({"type": "command", "command": ["true"]}),
                run_dir=tmp_path / "run",
                config=ControllerConfig(poll_interval_s=0.1),
            )
            run = asyncio.create_task(controller.run_until_done([toolz, host], timeout_s=30))
            jobs: dict = {}
            while len(jobs) < 2:
                jobs = {j["metadata"]["labels"]["harnessrl/rollout-id"]: j for j in fake.jobs()}
                await asyncio.sleep(0.05)
            for job in jobs.values():
                fake.succeed_job(job["metadata"]["name"])
            done = {r.rollout_id: r for r in await run}
            await controller.shutdown()
            api.close()
            return jobs, done

    jobs, done = asyncio.run(go())
    task_pod = jobs[toolz]["spec"]["template"]["spec"]
    assert task_pod["containers"][0]["image"] == "registry.local/swe/toolz:1"
    assert HARNESS_CONTAINER in {c["name"] for c in task_pod["initContainers"]}
    host_pod = jobs[host]["spec"]["template"]["spec"]
    assert host_pod["containers"][0]["image"] == "template:1"
    assert HARNESS_CONTAINER not in {c["name"] for c in host_pod.get("initContainers") or []}
    assert done[toolz].metadata["environment"] == {"image": "registry.local/swe/toolz:1", "image_id": None}
    assert done[toolz].reward == 1.0 and "environment" not in done[host].metadata
