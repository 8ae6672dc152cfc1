"""Pure manifest tests: Job/Secret/NetworkPolicy rendering, template merge, name derivation."""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, KEY, LOCAL_GATEWAY

from harnessrl.controller.base import ROLLOUT_PATHS, ResourceLimits
from harnessrl.controller.harness import MAX_EXEC_STRING
from harnessrl.controller.kubernetes import manifests
from harnessrl.controller.kubernetes.names import (
    MANAGED_BY_LABEL,
    attempt_labels,
    is_dns1123_label,
    label_value,
    resource_name,
)
from harnessrl.controller.kubernetes.network_policy import build_network_policy
from harnessrl.errors import BadRequest, ConfigError

TEMPLATE = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "ignored", "labels": {"team": "rl", MANAGED_BY_LABEL: "someone-else"}},
    "spec": {
        "backoffLimit": 6,
        "suspend": True,
        "podFailurePolicy": {
            "rules": [{"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        },
        "template": {
            "metadata": {"labels": {"sidecar.istio.io/inject": "false"}, "annotations": {"note": "kept"}},
            "spec": {
                "restartPolicy": "OnFailure",
                "nodeSelector": {"pool": "cpu"},
                "tolerations": [{"key": "spot", "operator": "Exists"}],
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "containers": [
                    {"name": "logger", "image": "busybox", "command": ["tail", "-f", "/dev/null"]},
                    {
                        "name": "harness",
                        "image": "ghcr.io/acme/agent:1",
                        "args": ["--old"],
                        "workingDir": "/repo",
                        "env": [
                            {"name": "HTTP_TIMEOUT", "value": "30"},
                            {"name": "MODEL", "value": "from-template"},
                            {"name": "OPENAI_API_KEY", "value": "literal-from-template"},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        ],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"}},
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    },
                ],
            },
        },
    },
}


def render(launch, template: Any = TEMPLATE, **kwargs: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        namespace="rl",
        job_name="hrl-r1-abc-a0",
        secret_name="hrl-r1-abc-a0",
        gateway_url=CLUSTER_GATEWAY,
        labels=attempt_labels("run-1", launch.rollout_id, launch.attempt),
        active_deadline_s=180.2,
    )
    options.update(kwargs)
    return manifests.build_job_manifest(template, launch, **options)


def harness(job: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "harness")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Port of Kubernetes' $(VAR) expansion (third_party/forked/golang/expansion): '$$' -> '$',
    '$(NAME)' -> value if defined else unchanged, any other '$' kept."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env.get(name, f"$({name})"))
                    i = end + 1
                    continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def test_job_fixed_fields_win_over_template(make_launch) -> None:
    job = render(make_launch())
    spec = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert job["metadata"]["name"] == "hrl-r1-abc-a0" and job["metadata"]["namespace"] == "rl"
    assert spec["backoffLimit"] == 0 and spec["completions"] == 1 and spec["parallelism"] == 1
    assert spec["activeDeadlineSeconds"] == 181  # rounded up: never cut a rollout short
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert "suspend" not in spec
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_template_cannot_make_the_job_run_a_second_pod(make_launch) -> None:
    """Bug: a template's podFailurePolicy rule with ``action: Ignore`` (the Kubernetes docs' pattern
    for retrying preempted pods) or per-index retries made the Job controller start a new pod after
    a failed one despite ``backoffLimit: 0``: the harness ran again within the same attempt, both
    runs' calls recorded as one attempt and scored by the last run (with an ``Ignore``d exit code,
    an agent could re-roll its episode at will)."""
    template = copy.deepcopy(TEMPLATE)
    disrupted = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    exit_42 = {
        "action": "Ignore",
        "onExitCodes": {"containerName": "harness", "operator": "In", "values": [42]},
    }
    counted = {"action": "Count", "onExitCodes": {"operator": "In", "values": [1]}}
    template["spec"]["podFailurePolicy"] = {"rules": [disrupted, exit_42, counted]}
    template["spec"].update(completionMode="Indexed", backoffLimitPerIndex=3, maxFailedIndexes=1)
    harness_container = template["spec"]["template"]["spec"]["containers"][1]
    assert harness_container["name"] == "harness"
    rules = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]
    harness_container.update(restartPolicy="Never", restartPolicyRules=rules)  # restarted in place on 42
    spec = render(make_launch(), template)["spec"]
    assert not {"restartPolicy", "restartPolicyRules"} & set(spec["template"]["spec"]["containers"][1])
    assert spec["podFailurePolicy"]["rules"] == [
        {**disrupted, "action": "FailJob"},
        {**exit_42, "action": "FailJob"},
        counted,
    ]
    assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec
    assert spec["backoffLimit"] == 0
    assert template["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"  # not mutated


def test_template_fields_are_preserved(make_launch) -> None:
    job = render(make_launch())
    pod = job["spec"]["template"]
    assert job["spec"]["podFailurePolicy"] == TEMPLATE["spec"]["podFailurePolicy"]
    assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert pod["spec"]["tolerations"] == [{"key": "spot", "operator": "Exists"}]
    assert pod["spec"]["containers"][0] == TEMPLATE["spec"]["template"]["spec"]["containers"][0]  # sidecar
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["annotations"]["note"] == "kept"
    assert job["metadata"]["labels"]["team"] == "rl"
    c = harness(job)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "cache", "mountPath": "/cache"} in c["volumeMounts"]
    assert {"name": "cache", "emptyDir": {}} in pod["spec"]["volumes"]
    env = env_of(c)
    assert env["HTTP_TIMEOUT"] == "30" and env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_template_is_not_mutated(make_launch) -> None:
    before = json.dumps(TEMPLATE, sort_keys=True)
    render(make_launch())
    assert json.dumps(TEMPLATE, sort_keys=True) == before


def test_labels_on_job_and_pod(make_launch) -> None:
    job = render(make_launch(rollout_id="r7", attempt=2))
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        labels = meta["labels"]
        assert labels[MANAGED_BY_LABEL] == "harnessrl"  # the template's value lost
        assert labels["harnessrl/rollout-id"] == "r7" and labels["harnessrl/attempt"] == "2"
        assert labels["harnessrl/run-id"] == "run-1"
        assert meta["annotations"]["harnessrl/rollout-id"] == "r7"
    assert job["spec"]["template"]["metadata"]["annotations"]["harnessrl/harness-container"] == "harness"


def test_container_command_image_workdir_limits(make_launch) -> None:
    launch = make_launch(limits=ResourceLimits(memory_mb=3000, cpus=1.5))
    c = harness(render(launch))
    assert c["command"] == ["python", "agent.py", "--task", "/harnessrl/task.json"]  # the mounted task file
    assert "args" not in c
    assert c["image"] == "ghcr.io/acme/agent:1"
    assert c["workingDir"] == "/repo"
    assert c["resources"]["limits"]["memory"] == "3000Mi" and c["resources"]["limits"]["cpu"] == "1500m"
    assert harness(render(launch, image="other:2"))["image"] == "other:2"
    sub = make_launch(cwd=launch.workspace / "src" / "pkg")
    assert harness(render(sub))["workingDir"] == "/repo/src/pkg"


def test_a_launch_rendered_for_the_sandboxs_fixed_paths_lands_in_the_pods_workspace(make_launch) -> None:
    """The controller renders for /rollout/workspace when the harness runs in bubblewrap; in a pod
    those paths mean the pod's workspace, exactly as the host paths did."""
    inside = ROLLOUT_PATHS
    launch = make_launch(
        argv=["python", "agent.py", "--out", f"{inside.workspace}/out.txt", str(inside.workspace)],
        cwd=inside.workspace / "src",
        inside=inside,
    )
    c = harness(render(launch))
    assert c["command"] == ["python", "agent.py", "--out", "/repo/out.txt", "/repo"]
    assert c["workingDir"] == "/repo/src"
    assert "/rollout/workspace" not in json.dumps(c)


def test_injected_env(make_launch) -> None:
    launch = make_launch(rollout_id="r/1 x")
    env = env_of(harness(render(launch)))
    assert env["OPENAI_BASE_URL"] == f"{CLUSTER_GATEWAY}/rollouts/r%2F1%20x/v1"
    assert env["ANTHROPIC_BASE_URL"] == f"{CLUSTER_GATEWAY}/rollouts/r%2F1%20x"
    assert env["HARNESSRL_ROLLOUT_ID"] == "r/1 x"
    assert json.loads(env["HARNESSRL_TASK"]) == launch.task
    assert env["HARNESSRL_TASK_FILE"] == "/harnessrl/task.json"
    assert env["MODEL"] == "policy"  # launch.env beats the template's env
    assert env["OPENAI_API_BASE"] == f"{CLUSTER_GATEWAY}/rollouts/r%2F1%20x/v1"
    assert "PATH" not in env  # the controller's machine, not the image's
    assert env["HOME"] == "/home/harnessrl"  # nor the controller's HOME: the pod's writable home volume
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        assert env[name] == {"secretKeyRef": {"name": "hrl-r1-abc-a0", "key": "api-key"}}
    names = [e["name"] for e in harness(render(launch))["env"]]
    assert len(names) == len(set(names))
    assert names[:2] == ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]  # before any $(OPENAI_API_KEY) reference


def test_no_literal_key_anywhere_in_job(make_launch) -> None:
    launch = make_launch(
        argv=["mini", "--api-key", KEY, f"--header=Authorization: Bearer {KEY}"],
        env={**make_launch().env, "MSWEA_API_KEY": KEY, "AUTH": f"Bearer {KEY}"},
    )
    job = render(launch)
    assert KEY not in json.dumps(job)
    # ...yet the kubelet's $(VAR) expansion gives the harness exactly what the controller asked for.
    c = harness(job)
    resolved = {"OPENAI_API_KEY": KEY}
    assert [k8s_expand(a, resolved) for a in c["command"]] == launch.argv
    env = {e["name"]: k8s_expand(e["value"], resolved) for e in c["env"] if "value" in e}
    assert env["MSWEA_API_KEY"] == KEY and env["AUTH"] == f"Bearer {KEY}"


@given(st.text(alphabet="ab$() {}x", max_size=30))
def test_argv_survives_kubernetes_expansion(arg: str) -> None:
    assert k8s_expand(manifests._literal(arg, KEY), {"OPENAI_API_KEY": KEY, "X": "boom"}) == arg


def test_local_gateway_urls_translated(make_launch) -> None:
    launch = make_launch(
        argv=["agent", "--base-url", f"{LOCAL_GATEWAY}/rollouts/r1/v1", f"--other={LOCAL_GATEWAY}/health"],
        env={**make_launch().env, "LITELLM_API_BASE": f"{LOCAL_GATEWAY}/rollouts/r1/v1"},
        files={"cfg.yaml": f"base_url: {LOCAL_GATEWAY}/rollouts/r1/v1\n"},
    )
    job = render(launch)
    c = harness(job)
    assert c["command"][2] == f"{CLUSTER_GATEWAY}/rollouts/r1/v1"
    assert c["command"][3] == f"--other={CLUSTER_GATEWAY}/health"
    assert env_of(c)["LITELLM_API_BASE"] == f"{CLUSTER_GATEWAY}/rollouts/r1/v1"
    assert "127.0.0.1" not in json.dumps(job)
    secret = manifests.build_secret_manifest(
        launch, namespace="rl", name="s", labels={}, gateway_url=CLUSTER_GATEWAY, workspace_dir="/repo"
    )
    files = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert files["file-0"] == f"base_url: {CLUSTER_GATEWAY}/rollouts/r1/v1\n"


def test_files_and_task_mounted_from_secret(make_launch) -> None:
    launch = make_launch(files={"agent.py": "x", "conf/settings.toml": "y"})
    job = render(launch)
    pod = job["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "harnessrl")
    assert volume["secret"]["secretName"] == "hrl-r1-abc-a0"
    assert {i["key"] for i in volume["secret"]["items"]} == {"task.json", "file-0", "file-1"}
    mounts = {m["mountPath"]: m for m in harness(job)["volumeMounts"]}
    assert mounts["/harnessrl"]["readOnly"] is True
    assert mounts["/repo/agent.py"]["subPath"] == "file-0"
    assert mounts["/repo/conf/settings.toml"]["subPath"] == "file-1"
    with pytest.raises(BadRequest):
        render(make_launch(files={"../escape.py": "x"}))
    with pytest.raises(BadRequest):
        render(make_launch(files={"/etc/passwd": "x"}))


def test_a_task_too_long_for_one_variable_is_left_to_the_task_file(make_launch) -> None:
    # The container's exec refuses an environment entry past MAX_EXEC_STRING (E2BIG): every attempt
    # of such a task failed. The task file (a Secret) holds the same JSON.
    big = make_launch(task={"prompt": "x" * (MAX_EXEC_STRING + 1)})
    env = env_of(harness(render(big)))
    assert "HARNESSRL_TASK" not in env and env["HARNESSRL_TASK_FILE"] == "/harnessrl/task.json"
    assert "HARNESSRL_TASK" in env_of(harness(render(make_launch())))  # control: a usual task has it


def test_template_shapes(make_launch) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "main", "image": "img"}]},
    }
    job = render(make_launch(), pod)
    assert job["spec"]["template"]["metadata"]["labels"]["a"] == "b"
    assert "name" not in job["spec"]["template"]["metadata"]
    assert (
        job["spec"]["template"]["spec"]["containers"][0]["name"] == "main"
    )  # first container is the harness
    spec_only = {"spec": {"containers": [{"name": "harness", "image": "img"}]}}
    assert render(make_launch(), spec_only)["spec"]["template"]["spec"]["containers"][0]["image"] == "img"
    pod_template = {"kind": "PodTemplate", "template": spec_only}
    assert render(make_launch(), pod_template)["spec"]["backoffLimit"] == 0
    empty = render(make_launch(), None, image="img")
    assert empty["spec"]["template"]["spec"]["containers"][0]["image"] == "img"
    assert empty["spec"]["template"]["spec"]["containers"][0]["workingDir"] == "/workspace"
    with pytest.raises(ConfigError):
        render(make_launch(), None)  # no image anywhere
    with pytest.raises(ConfigError):
        render(make_launch(), {"kind": "Deployment", "spec": {}})
    with pytest.raises(ConfigError):
        render(make_launch(), TEMPLATE, container_name="nope")


def test_launch_without_key_is_rejected(make_launch) -> None:
    with pytest.raises(BadRequest):
        render(make_launch(env={"OPENAI_BASE_URL": "x"}))


def test_secret_manifest(make_launch) -> None:
    launch = make_launch()
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-1"}
    secret = manifests.build_secret_manifest(
        launch,
        namespace="rl",
        name="hrl-x",
        labels=attempt_labels("run-1", "r1", 0),
        gateway_url=CLUSTER_GATEWAY,
        owner=owner,
    )
    assert secret["kind"] == "Secret" and secret["type"] == "Opaque"
    assert secret["metadata"]["ownerReferences"] == [owner]
    assert secret["metadata"]["labels"]["harnessrl/rollout-id"] == "r1"
    assert base64.b64decode(secret["data"]["api-key"]).decode() == KEY
    assert json.loads(base64.b64decode(secret["data"]["task.json"])) == launch.task
    assert "stringData" not in secret
    big = make_launch(files={"blob.bin": "x" * (1024 * 1024)})
    with pytest.raises(BadRequest, match="Secret holds at most"):
        manifests.build_secret_manifest(big, namespace="rl", name="s", labels={}, gateway_url=CLUSTER_GATEWAY)


def test_owner_reference() -> None:
    ref = manifests.owner_reference({"metadata": {"name": "j", "uid": "u"}})
    assert ref == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "j",
        "uid": "u",
        "blockOwnerDeletion": False,
    }


def test_network_policy_allows_egress_only_to_gateway() -> None:
    policy = build_network_policy(
        "rl",
        gateway_port=8000,
        gateway_pod_labels={"app": "gw"},
        gateway_namespace="harnessrl",
        allow_dns=True,
    )
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {MANAGED_BY_LABEL: "harnessrl"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    gateway, dns = spec["egress"]
    assert gateway["to"] == [
        {
            "podSelector": {"matchLabels": {"app": "gw"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "harnessrl"}},
        }
    ]
    assert gateway["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    for rule in spec["egress"]:  # no rule opens anything wider than its peer
        assert all("ipBlock" not in peer for peer in rule["to"]) and rule["ports"]


def test_network_policy_cidr_and_no_dns() -> None:
    spec = build_network_policy("rl", gateway_port=443, gateway_cidr="10.0.0.7/32", allow_dns=False)["spec"]
    assert spec["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.7/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}
    ]
    with pytest.raises(ConfigError):
        build_network_policy("rl", gateway_port=1)
    with pytest.raises(ConfigError):
        build_network_policy("rl", gateway_port=1, gateway_cidr="1.2.3.4/32", gateway_pod_labels={})


def test_resource_name_is_deterministic_and_valid() -> None:
    a = resource_name("rollout-123", 0, scope="run-1")
    assert a == resource_name("rollout-123", 0, scope="run-1")
    assert a.startswith("hrl-rollout-123-") and a.endswith("-a0")
    assert a != resource_name("rollout-123", 1, scope="run-1")
    assert a != resource_name("rollout-123", 0, scope="run-2")
    # slugs collide, hashes keep them apart
    assert resource_name("A_b", 0) != resource_name("a-b", 0)
    long = resource_name("x" * 500, 12345, prefix="my-team")
    assert is_dns1123_label(long) and len(long) <= 63
    assert is_dns1123_label(resource_name("___", 0))
    with pytest.raises(ValueError):
        resource_name("r", -1)


@given(st.text(max_size=200), st.integers(min_value=0, max_value=10**6), st.text(max_size=20))
def test_resource_name_always_dns1123(rollout_id: str, attempt: int, scope: str) -> None:
    name = resource_name(rollout_id, attempt, scope=scope)
    assert is_dns1123_label(name)


@given(st.text(max_size=120))
def test_label_value_always_valid(value: str) -> None:
    out = label_value(value)
    assert len(out) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", out)
    if len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value):
        assert out == value
