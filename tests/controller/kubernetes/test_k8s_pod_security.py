"""The hardened pod: security contexts, writable volumes for a read-only image, the seed init
container, config validation, and the explicit opt-outs."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration
from pydantic import ValidationError
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, FakeKubernetes
from tests.controller.kubernetes.test_k8s_manifests import env_of, harness, render

from harnessrl.controller.kubernetes import KubernetesRunner, KubernetesRunnerConfig
from harnessrl.controller.kubernetes.config import PodSecurityConfig
from harnessrl.controller.kubernetes.pod_security import SEED_CONTAINER, SEED_MOUNT, SEED_SCRIPT
from harnessrl.errors import ConfigError

TEMPLATE = {
    "spec": {
        "containers": [
            {
                "name": "harness",
                "image": "ghcr.io/acme/agent:1",
                "imagePullPolicy": "IfNotPresent",
                "workingDir": "/repo",
                "resources": {
                    # at most the limits launch.limits gives (500m, 1024Mi): the API refuses more
                    "requests": {"cpu": "250m", "memory": "512Mi"},
                    "limits": {"nvidia.com/gpu": "1", "ephemeral-storage": "10Gi"},
                },
            }
        ]
    }
}
POD_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "fsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "procMount": "Default",
    "privileged": False,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
POLICY = {"gateway_port": 8000, "gateway_pod_labels": {"app": "harnessrl-gateway"}}


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def mounts_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def test_hardened_by_default(make_launch) -> None:
    job = render(make_launch(), TEMPLATE)
    spec = pod_spec(job)
    assert spec["securityContext"] == POD_CONTEXT
    assert harness(job)["securityContext"] == CONTAINER_CONTEXT
    assert spec["automountServiceAccountToken"] is False
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert spec["shareProcessNamespace"] is False


def test_writable_volumes_exist_and_are_mounted(make_launch) -> None:
    job = render(make_launch(files={"agent.py": "x"}), TEMPLATE)
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    for name in ("harnessrl-workspace", "harnessrl-home", "harnessrl-tmp"):
        assert volumes[name] == {"name": name, "emptyDir": {}}
    c = harness(job)
    mounts = mounts_of(c)
    assert mounts["/repo"] == {"name": "harnessrl-workspace", "mountPath": "/repo"}
    assert mounts["/home/harnessrl"] == {"name": "harnessrl-home", "mountPath": "/home/harnessrl"}
    assert mounts["/tmp"] == {"name": "harnessrl-tmp", "mountPath": "/tmp"}
    assert env_of(c)["HOME"] == "/home/harnessrl"
    # what worked before still does: the task and harness files come read-only from the Secret,
    # the files on top of the (now writable) workspace; the workspace is mounted before them
    assert mounts["/harnessrl"]["readOnly"] is True
    assert mounts["/repo/agent.py"] == {
        "name": "harnessrl",
        "mountPath": "/repo/agent.py",
        "subPath": "file-0",
        "readOnly": True,
    }
    paths = [m["mountPath"] for m in c["volumeMounts"]]
    assert paths.index("/repo") < paths.index("/repo/agent.py")
    assert c["workingDir"] == "/repo"


def test_seed_container_copies_the_image_workspace(make_launch) -> None:
    spec = pod_spec(render(make_launch(), TEMPLATE))
    (seed,) = spec["initContainers"]
    assert seed == {
        "name": SEED_CONTAINER,
        "image": "ghcr.io/acme/agent:1",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", SEED_SCRIPT.replace("$", "$$"), SEED_CONTAINER, "/repo", SEED_MOUNT],
        "securityContext": CONTAINER_CONTEXT,
        "volumeMounts": [{"name": "harnessrl-workspace", "mountPath": SEED_MOUNT}],
        # the harness's cpu/memory/storage (launch.limits applied) so quotas admit it; no GPU for a copy
        "resources": {
            "requests": {"cpu": "250m", "memory": "512Mi"},
            "limits": {"ephemeral-storage": "10Gi", "memory": "1024Mi", "cpu": "500m"},
        },
    }


def test_seed_script_copies_contents_and_skips_a_missing_workspace(tmp_path: Path) -> None:
    image_ws, volume = tmp_path / "repo", tmp_path / "volume"
    (image_ws / "src").mkdir(parents=True)
    (image_ws / "src" / "main.py").write_text("print(1)\n")
    (image_ws / ".git").mkdir()
    (image_ws / "run.sh").write_text("#!/bin/sh\n")
    (image_ws / "run.sh").chmod(0o755)
    (image_ws / "root").symlink_to("/")
    volume.mkdir()
    subprocess.run(["sh", "-c", SEED_SCRIPT, "seed", str(image_ws), str(volume)], check=True)
    assert (volume / "src" / "main.py").read_text() == "print(1)\n"
    assert (volume / ".git").is_dir()  # dotfiles too
    assert os.access(volume / "run.sh", os.X_OK)
    assert (volume / "root").is_symlink()  # a link, not a copy of /
    missing = subprocess.run(["sh", "-c", SEED_SCRIPT, "seed", str(tmp_path / "nope"), str(volume)])
    assert missing.returncode == 0


def test_template_cannot_weaken_the_context(make_launch) -> None:
    template = copy.deepcopy(TEMPLATE)
    spec = template["spec"]
    spec.update(
        automountServiceAccountToken=True,
        hostNetwork=True,
        hostPID=True,
        securityContext={"runAsUser": 0, "runAsNonRoot": False, "supplementalGroups": [4242]},
    )
    spec["containers"][0]["securityContext"] = {
        "runAsUser": 0,
        "privileged": True,
        "allowPrivilegeEscalation": True,
        "capabilities": {"add": ["SYS_ADMIN"]},
        "readOnlyRootFilesystem": False,
        "seccompProfile": {"type": "Unconfined"},
        "seLinuxOptions": {"level": "s0:c123,c456"},
    }
    job = render(make_launch(), template)
    assert pod_spec(job)["securityContext"] == {**POD_CONTEXT, "supplementalGroups": [4242]}
    assert harness(job)["securityContext"] == {
        **CONTAINER_CONTEXT,
        "seLinuxOptions": {"level": "s0:c123,c456"},
    }
    assert pod_spec(job)["automountServiceAccountToken"] is False
    assert pod_spec(job)["hostNetwork"] is False and pod_spec(job)["hostPID"] is False


def test_template_cannot_weaken_isolation_through_the_other_security_fields(make_launch) -> None:
    """Bug: hardening kept the template's shareProcessNamespace, supplementalGroups [0], AppArmor
    Unconfined, SELinux type spc_t and procMount Unmasked: each lifts part of the sandbox."""
    template = copy.deepcopy(TEMPLATE)
    spec = template["spec"]
    spec.update(
        shareProcessNamespace=True,
        securityContext={
            "supplementalGroups": [0, 4242],
            "appArmorProfile": {"type": "Unconfined"},
            "seLinuxOptions": {"type": "spc_t", "level": "s0:c1,c2"},
        },
    )
    spec["containers"][0]["securityContext"] = {
        "procMount": "Unmasked",
        "appArmorProfile": {"type": "Unconfined"},
        "seLinuxOptions": {"type": "spc_t", "user": "system_u", "role": "system_r"},
    }
    job = render(make_launch(), template)
    assert pod_spec(job)["shareProcessNamespace"] is False
    assert pod_spec(job)["securityContext"] == {
        **POD_CONTEXT,
        "supplementalGroups": [4242],  # root's group gone, the others kept
        "appArmorProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"level": "s0:c1,c2"},  # the MCS level only: no domain of its own choosing
    }
    assert harness(job)["securityContext"] == {
        **CONTAINER_CONTEXT,
        "appArmorProfile": {"type": "RuntimeDefault"},
    }  # procMount back to Default (in CONTAINER_CONTEXT), no seLinuxOptions left


def test_template_localhost_apparmor_profile_is_kept(make_launch) -> None:
    template = copy.deepcopy(TEMPLATE)
    profile = {"type": "Localhost", "localhostProfile": "k8s-harness"}
    template["spec"]["containers"][0]["securityContext"] = {"appArmorProfile": profile}
    assert harness(render(make_launch(), template))["securityContext"]["appArmorProfile"] == profile


def test_a_host_path_volume_is_refused_in_a_hardened_pod(make_launch) -> None:
    """Bug: a writable hostPath mount in the harness container reached a hardened pod (the builder
    checks too, for callers that skip the config)."""
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["volumes"] = [{"name": "node", "hostPath": {"path": "/"}}]
    template["spec"]["containers"][0]["volumeMounts"] = [{"name": "node", "mountPath": "/node"}]
    with pytest.raises(ConfigError, match="hostPath"):
        render(make_launch(), template)
    opted_out = render(make_launch(), template, pod_security=PodSecurityConfig(enabled=False))
    assert {"name": "node", "hostPath": {"path": "/"}} in pod_spec(opted_out)["volumes"]


# What the API server adds to every pod that automounts a token: a template copied from a live pod
# (``kubectl get pod -o yaml``) carries it.
TOKEN_VOLUME = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ],
    },
}
TOKEN_MOUNT = {
    "name": "kube-api-access-x7k2p",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    "readOnly": True,
}


def test_a_template_volume_cannot_hand_the_harness_a_token(make_launch) -> None:
    """Bug: ``automountServiceAccountToken: false`` only stops the API server adding a token; the
    template's own projected token volume (in every pod copied with ``kubectl get pod -o yaml``)
    stayed mounted in the harness container, and the kubelet wrote the pod's service-account token
    there: the agent could talk to the API server as the pod."""
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["volumes"] = [TOKEN_VOLUME, {"name": "cache", "emptyDir": {}}]
    template["spec"]["containers"][0]["volumeMounts"] = [
        TOKEN_MOUNT,
        {"name": "cache", "mountPath": "/cache"},
    ]
    template["spec"]["containers"].append(
        {"name": "shipper", "image": "fluent-bit", "volumeMounts": [dict(TOKEN_MOUNT)]}
    )
    job = render(make_launch(), template)
    mounted = {m["name"] for m in harness(job)["volumeMounts"]}
    assert TOKEN_VOLUME["name"] not in mounted and "cache" in mounted
    # A sidecar that mounts it keeps it (the template's choice for a container the agent is not in).
    assert TOKEN_VOLUME in pod_spec(job)["volumes"]
    template["spec"]["containers"].pop()
    alone = pod_spec(render(make_launch(), template))
    assert all(v["name"] != TOKEN_VOLUME["name"] for v in alone["volumes"])
    opted_out = render(make_launch(), template, pod_security=PodSecurityConfig(enabled=False))
    assert TOKEN_MOUNT in harness(opted_out)["volumeMounts"]


def test_template_localhost_seccomp_profile_is_kept(make_launch) -> None:
    template = copy.deepcopy(TEMPLATE)
    profile = {"type": "Localhost", "localhostProfile": "profiles/harness.json"}
    template["spec"]["securityContext"] = {"seccompProfile": profile}
    template["spec"]["containers"][0]["securityContext"] = {"seccompProfile": profile}
    job = render(make_launch(), template)
    assert pod_spec(job)["securityContext"]["seccompProfile"] == profile
    assert harness(job)["securityContext"]["seccompProfile"] == profile


def test_template_mount_at_the_workspace_is_kept(make_launch) -> None:
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["volumes"] = [{"name": "repo", "persistentVolumeClaim": {"claimName": "repo"}}]
    template["spec"]["containers"][0]["volumeMounts"] = [{"name": "repo", "mountPath": "/repo/"}]
    spec = pod_spec(render(make_launch(), template))
    names = {v["name"] for v in spec["volumes"]}
    assert "repo" in names and "harnessrl-workspace" not in names
    assert {"harnessrl-home", "harnessrl-tmp"} <= names
    assert "initContainers" not in spec  # nothing to seed: the workspace is the template's volume


def test_uid_override_is_explicit(make_launch) -> None:
    security = PodSecurityConfig(run_as_user=1001, run_as_group=1002, fs_group=2000, seed_workspace=False)
    job = render(make_launch(), TEMPLATE, pod_security=security)
    spec = pod_spec(job)
    assert spec["securityContext"] == {**POD_CONTEXT, "runAsUser": 1001, "runAsGroup": 1002, "fsGroup": 2000}
    assert harness(job)["securityContext"] == {**CONTAINER_CONTEXT, "runAsUser": 1001, "runAsGroup": 1002}
    assert "initContainers" not in spec  # seed_workspace=false: the workspace volume starts empty
    assert "harnessrl-workspace" in {v["name"] for v in spec["volumes"]}


def test_opt_out_leaves_the_template_as_written(make_launch) -> None:
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["automountServiceAccountToken"] = True
    template["spec"]["containers"][0]["securityContext"] = {"runAsUser": 0}
    job = render(make_launch(), template, pod_security=PodSecurityConfig(enabled=False))
    spec = pod_spec(job)
    assert "securityContext" not in spec and "initContainers" not in spec and "hostNetwork" not in spec
    assert spec["automountServiceAccountToken"] is True
    assert harness(job)["securityContext"] == {"runAsUser": 0}
    assert {v["name"] for v in spec["volumes"]} == {"harnessrl"}  # only the Secret
    assert "HOME" not in env_of(harness(job))
    # without a template value the token still defaults to off
    bare = render(make_launch(), TEMPLATE, pod_security=PodSecurityConfig(enabled=False))
    assert pod_spec(bare)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("field", ["run_as_user", "run_as_group", "fs_group"])
@pytest.mark.parametrize("value", [0, -1])
def test_root_ids_are_refused_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as info:
        PodSecurityConfig(**{field: value})
    (error,) = info.value.errors()
    assert error["loc"] == (field,) and "0 is root" in error["msg"]
    with pytest.raises(ValidationError, match=rf"pod_security\.{field}"):
        KubernetesRunnerConfig(
            gateway_url=CLUSTER_GATEWAY, network_policy=POLICY, pod_security={field: value}
        )


def test_runner_refuses_root_with_a_config_error() -> None:
    # the config is checked before any client exists, so no API server is needed here
    with pytest.raises(ConfigError, match=r"pod_security\.run_as_user"):
        KubernetesRunner(
            None,
            gateway_url=CLUSTER_GATEWAY,
            network_policy=POLICY,
            job_template=TEMPLATE,
            pod_security={"run_as_user": 0},
        )


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_runner_creates_hardened_jobs(fake_k8s: FakeKubernetes, make_launch, anyio_backend) -> None:
    """Through the official client: the hardened fields survive its models and serialization."""
    api = ApiClient(Configuration(host=fake_k8s.url))
    runner = KubernetesRunner(
        api,
        gateway_url=CLUSTER_GATEWAY,
        network_policy=POLICY,
        job_template=TEMPLATE,
        run_id="run-1",
        poll_interval_s=0.2,
        pod_security={"run_as_user": 4242},
    )
    try:
        handle = await runner.launch(make_launch("r1"))
        job = fake_k8s.job(handle.job_name)
        assert job is not None
        spec = pod_spec(job)
        assert spec["securityContext"] == {**POD_CONTEXT, "runAsUser": 4242}
        assert harness(job)["securityContext"] == {**CONTAINER_CONTEXT, "runAsUser": 4242}
        assert spec["initContainers"][0]["securityContext"] == {**CONTAINER_CONTEXT, "runAsUser": 4242}
        assert {"/repo", "/home/harnessrl", "/tmp"} <= set(mounts_of(harness(job)))
        assert spec["automountServiceAccountToken"] is False
    finally:
        await runner.aclose()
        api.close()
