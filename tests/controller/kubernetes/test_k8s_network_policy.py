"""What a harness pod may reach, as a CNI enforcing the runner's NetworkPolicies would compute it
(``FakeKubernetes.egress_rules``: policies are additive, a pod no Egress policy selects is open),
with several runs, and their gateways, in one namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, NetworkingV1Api
from tests.controller.kubernetes.k8s_support import FakeKubernetes

from harnessrl.controller.kubernetes import KubernetesRunner
from harnessrl.controller.kubernetes.network_policy import (
    build_baseline_policy,
    build_network_policy,
    run_policy_name,
)

pytestmark = pytest.mark.anyio

TEMPLATE = {"spec": {"containers": [{"name": "harness", "image": "ghcr.io/acme/agent:1"}]}}
GATEWAY_A = {"gateway_port": 8000, "gateway_pod_labels": {"app": "gateway-a"}}
GATEWAY_B = {"gateway_port": 9000, "gateway_cidr": "10.96.40.2/32"}
RULE_A = {
    "to": [{"podSelector": {"matchLabels": {"app": "gateway-a"}}}],
    "ports": [{"protocol": "TCP", "port": 8000}],
}
RULE_B = {"to": [{"ipBlock": {"cidr": "10.96.40.2/32"}}], "ports": [{"protocol": "TCP", "port": 9000}]}


def pod_of(fake: FakeKubernetes, job_name: str) -> dict[str, Any]:
    (pod,) = [p for p in fake.list("pods") if p["metadata"]["labels"].get("job-name") == job_name]
    return pod


async def test_two_runs_in_one_namespace_each_reach_only_their_own_gateway(
    fake_k8s, make_runner: Callable[..., KubernetesRunner], make_launch
) -> None:
    """Bug: every run ensured one policy of the same name selecting every harnessrl pod of the
    namespace, each with its own gateway: the second run's start replaced the first's allow-list,
    so the first run's harnesses could no longer reach their gateway (every call refused, every
    rollout scored as the policy's failure) and could reach the second run's."""
    run_a = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A)
    a1 = await run_a.launch(make_launch("r1"))
    run_b = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_B)
    b1 = await run_b.launch(make_launch("r1"))
    a2 = await run_a.launch(make_launch("r2"))  # launched after run B's start too
    for handle in (a1, a2):
        assert fake_k8s.egress_rules(pod_of(fake_k8s, handle.job_name)) == [RULE_A]
    assert fake_k8s.egress_rules(pod_of(fake_k8s, b1.job_name)) == [RULE_B]
    for handle in (a1, a2, b1):  # and no ingress: still denied for every harness pod
        labels = pod_of(fake_k8s, handle.job_name)["metadata"]["labels"]
        baseline = fake_k8s.get("networkpolicies", "harnessrl-harness-egress")
        assert baseline is not None and baseline["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert baseline["spec"].get("ingress", []) == []  # stored without its empty lists
        assert all(labels.get(k) == v for k, v in baseline["spec"]["podSelector"]["matchLabels"].items())


async def test_a_pod_whose_run_has_no_allow_list_is_shut_not_open(
    fake_k8s, make_runner: Callable[..., KubernetesRunner], make_launch
) -> None:
    """Scoping the allow-list by run must not leave a pod that no allow-list selects (its run's
    policy deleted, or never made) with open egress: the namespace's baseline selects every
    harnessrl pod and allows nothing."""
    runner = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A)
    handle = await runner.launch(make_launch("r1"))
    api = ApiClient(Configuration(host=fake_k8s.url))
    NetworkingV1Api(api).delete_namespaced_network_policy(
        run_policy_name("harnessrl-harness-egress", runner.run_id), "default"
    )
    api.close()
    assert fake_k8s.egress_rules(pod_of(fake_k8s, handle.job_name)) == []


async def test_a_runner_with_a_drawn_run_id_deletes_its_allow_list_when_it_closes(
    fake_k8s, make_runner: Callable[..., KubernetesRunner], make_launch
) -> None:
    """Every runner start without kubernetes.run_id draws a run of its own: its allow-list is deleted
    with its Jobs, not left behind by every controller restart. One that leaves its Jobs running, or
    whose run is named (shared, adopted after a restart), keeps it."""
    drawn = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A)
    named = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_B, run_id="run-9")
    leaves = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A)
    for runner in (drawn, named, leaves):
        await runner.launch(make_launch("r1"))
    await drawn.aclose()
    await named.aclose()
    await leaves.aclose(kill_running=False)
    names = {p["metadata"]["name"] for p in fake_k8s.list("networkpolicies")}
    base = "harnessrl-harness-egress"
    assert names == {base, run_policy_name(base, "run-9"), run_policy_name(base, leaves.run_id)}


def test_the_run_allow_list_selects_only_the_runs_pods_and_has_a_valid_name() -> None:
    long_base = "p" * 253
    for base in ("harnessrl-harness-egress", long_base):
        name = run_policy_name(base, "run-1")
        assert len(name) <= 253 and name != run_policy_name(base, "run-2")
        assert name == run_policy_name(base, "run-1")
    run = build_network_policy(
        "rl", gateway_port=8000, gateway_cidr="10.0.0.7/32", pod_labels={"harnessrl/run-id": "run-1"}
    )
    assert run["spec"]["podSelector"]["matchLabels"] == {
        "harnessrl/run-id": "run-1",
        "app.kubernetes.io/managed-by": "harnessrl",
    }
    baseline = build_baseline_policy("rl")["spec"]
    assert baseline["egress"] == [] and baseline["ingress"] == []
    assert baseline["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "harnessrl"}}


def policy_puts(fake: FakeKubernetes) -> int:
    return sum(1 for method, path, _ in fake.requests if method == "PUT" and "networkpolicies" in path)


async def test_runners_starting_together_do_not_fail_on_the_shared_baseline(
    fake_k8s, make_runner: Callable[..., KubernetesRunner], make_launch
) -> None:
    """Bug: the API server gives a policy back without its empty lists, so every start found the
    baseline "changed" and replaced it; runners starting at once (the controllers of one Deployment,
    the runs of a namespace) replaced it from the same resourceVersion, and the loser's start, and
    with it its launch, failed with a ConfigError on the 409 Conflict. A replace that is needed (the
    run's allow-list under another config) is read and tried again after a 409."""
    first = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A, run_id="x")
    await first.start()
    before = policy_puts(fake_k8s)
    # Another runner's replace lands first: the next replace of ours is refused (409), once.
    fake_k8s.add_fault("PUT", "networkpolicies", code=409, reason="Conflict", message="modified")
    second = make_runner(namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_A)
    await second.launch(make_launch("r1"))
    assert policy_puts(fake_k8s) == before  # the baseline's spec is the same: nothing replaced
    reconfigured = make_runner(
        namespace="default", job_template=TEMPLATE, network_policy=GATEWAY_B, run_id="x"
    )
    await reconfigured.launch(make_launch("r2"))
    allow_list = fake_k8s.get("networkpolicies", run_policy_name("harnessrl-harness-egress", "x"))
    assert allow_list is not None and allow_list["spec"]["egress"] == [RULE_B]
