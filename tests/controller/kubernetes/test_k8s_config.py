"""The ``[kubernetes]`` section refuses settings that parse but cannot work, or that quietly open the
sandbox: non-finite times, label maps that select every pod, a gateway the pods cannot reach
without the DNS they are denied, hostPath volumes in a hardened pod."""

from __future__ import annotations

from typing import Any

import pytest
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY

from harnessrl.config import load_raw_config, validate_config
from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig, NetworkPolicyConfig
from harnessrl.controller.kubernetes.network_policy import build_network_policy
from harnessrl.controller.stack import RolloutConfig
from harnessrl.errors import ConfigError

POLICY = {"gateway_port": 8000, "gateway_pod_labels": {"app": "harnessrl-gateway"}}


def rollout_config(kubernetes: dict[str, Any] | None = None, **harness: Any) -> RolloutConfig:
    section = {"gateway_url": CLUSTER_GATEWAY, "network_policy": POLICY, **(kubernetes or {})}
    return validate_config(
        RolloutConfig,
        {
            "harness": {"command": ["agent"], **harness},
            "evaluator": {"type": "exact_match"},
            "kubernetes": section,
        },
    )


# --- finite times: inf is valid TOML and passed gt=0 -----------------------------------------------
@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize(
    "field",
    ["startup_allowance_s", "poll_interval_s", "stuck_pending_s", "orphan_grace_s", "request_timeout_s"],
)
def test_non_finite_kubernetes_times_are_refused_naming_the_field(field: str, value: float) -> None:
    """Bug: startup_allowance_s = inf loaded, then math.ceil(inf) in the Job's deadline raised
    OverflowError, which the controller does not catch: the rollout stayed `running`."""
    with pytest.raises(ConfigError, match=rf"kubernetes\.{field}"):
        rollout_config({field: value})


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_a_non_finite_harness_timeout_is_refused_naming_the_field(value: float) -> None:
    """Bug: harness.timeout_s = inf loaded (gt=0) and crashed the Job manifest (math.ceil)."""
    with pytest.raises(ConfigError, match=r"harness\.timeout_s"):
        rollout_config(timeout_s=value)


def test_a_non_finite_cpu_limit_is_refused_naming_the_field() -> None:
    """limits.cpus becomes a millicore quantity through math.ceil as well."""
    with pytest.raises(ConfigError, match=r"harness\.limits\.cpus"):
        rollout_config(limits={"cpus": float("inf")})


def test_finite_times_load() -> None:
    """Control: the same fields with finite values load."""
    config = rollout_config(
        {"startup_allowance_s": 30, "orphan_grace_s": 0}, timeout_s=900, limits={"cpus": 1.5}
    )
    assert config.kubernetes is not None and config.kubernetes.startup_allowance_s == 30
    assert config.harness.timeout_s == 900 and config.harness.limits.cpus == 1.5


# --- label maps: {} selects every pod --------------------------------------------------------------
@pytest.mark.parametrize("field", ["gateway_pod_labels", "dns_pod_labels"])
def test_an_empty_label_map_is_refused_naming_the_field(field: str) -> None:
    """Bug: gateway_pod_labels = {} became podSelector {} (every pod of the namespace reachable on
    gateway_port); dns_pod_labels = {} was silently replaced by the default labels."""
    with pytest.raises(ConfigError, match=rf"kubernetes\.network_policy\.{field}"):
        rollout_config({"network_policy": {**POLICY, "allow_dns": True, field: {}}})
    with pytest.raises(ConfigError, match=field):
        build_network_policy(
            "rl", gateway_port=8000, allow_dns=True, **{"gateway_pod_labels": {"app": "gw"}, field: {}}
        )


# --- no DNS by default; the gateway by IP ----------------------------------------------------------
def test_pods_get_no_dns_unless_asked() -> None:
    """Bug: allow_dns defaulted to true, so pods could query cluster DNS, which forwards outside
    names (data tunnelled out in TXT lookups), while the docs promised the gateway and nothing else."""
    assert NetworkPolicyConfig(**POLICY).allow_dns is False
    egress = build_network_policy("rl", gateway_port=8000, gateway_pod_labels={"app": "gw"})["spec"]["egress"]
    assert egress == [
        {
            "to": [{"podSelector": {"matchLabels": {"app": "gw"}}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        }
    ]


def test_without_dns_the_gateway_must_be_named_by_ip() -> None:
    """A gateway name no pod can resolve would fail every attempt: refused when the config loads."""
    with pytest.raises(ConfigError, match=r"gateway_url.*allow_dns"):
        rollout_config({"gateway_url": "http://harnessrl-gateway.rl.svc:8000"})
    # the ways that work: an IP (v4 or v6), DNS explicitly allowed, or no policy of ours at all
    for section in (
        {"gateway_url": "http://10.96.0.10:8000"},
        {"gateway_url": "http://[fd00::10]:8000"},
        {
            "gateway_url": "http://harnessrl-gateway.rl.svc:8000",
            "network_policy": {**POLICY, "allow_dns": True},
        },
        {"gateway_url": "http://harnessrl-gateway.rl.svc:8000", "network_policy": None},
    ):
        assert rollout_config(section).kubernetes is not None


def test_a_config_file_opts_out_of_the_network_policy_with_false(tmp_path) -> None:
    # TOML has no null: the documented opt-out must be writable in the file the controller reads.
    config = tmp_path / "c.toml"
    config.write_text(
        '[harness]\ncommand = ["agent"]\n[evaluator]\ntype = "exact_match"\n'
        f'[kubernetes]\ngateway_url = "{CLUSTER_GATEWAY}"\nnetwork_policy = false\n'
    )
    loaded = validate_config(RolloutConfig, load_raw_config(str(config), []))
    assert loaded.kubernetes is not None and loaded.kubernetes.network_policy is None
    with pytest.raises(ConfigError, match=r"kubernetes\.network_policy"):
        rollout_config({"network_policy": True})  # not a policy: its fields are needed


# --- hostPath volumes in a hardened pod ------------------------------------------------------------
HOST_PATH_TEMPLATE = {
    "spec": {
        "volumes": [{"name": "node", "hostPath": {"path": "/var/lib"}}],
        "containers": [
            {"name": "harness", "image": "agent:1", "volumeMounts": [{"name": "node", "mountPath": "/node"}]}
        ],
    }
}


def test_a_host_path_volume_is_refused_while_hardened() -> None:
    """Bug: a template's writable hostPath mount reached the harness container of a hardened pod."""
    with pytest.raises(ConfigError, match=r"hostPath"):
        rollout_config({"job_template": HOST_PATH_TEMPLATE})
    opted_out = KubernetesRunnerConfig(
        gateway_url=CLUSTER_GATEWAY,
        network_policy=POLICY,
        job_template=HOST_PATH_TEMPLATE,
        pod_security={"enabled": False},
    )
    assert opted_out.job_template == HOST_PATH_TEMPLATE  # explicit opt-out: as written
