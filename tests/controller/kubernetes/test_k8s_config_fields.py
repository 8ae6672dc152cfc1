"""Names, paths and addresses of the ``[kubernetes]`` section that the API server (or the container
runtime) refuses are refused when the config loads, naming the field: they used to load, and then
failed every rollout in turn at its launch (or every attempt's container, as INFRA)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY

from harnessrl.config import validate_config
from harnessrl.controller.stack import RolloutConfig
from harnessrl.errors import ConfigError

POLICY = {"gateway_port": 8000, "gateway_pod_labels": {"app": "harnessrl-gateway"}}
TEMPLATE = {"spec": {"containers": [{"name": "agent", "image": "ghcr.io/acme/agent:1"}]}}


def rollout_config(
    kubernetes: dict[str, Any] | None = None, policy: dict[str, Any] | None = None
) -> RolloutConfig:
    section = {
        "gateway_url": CLUSTER_GATEWAY,
        "network_policy": {**POLICY, **(policy or {})},
        "job_template": TEMPLATE,
        **(kubernetes or {}),
    }
    return validate_config(
        RolloutConfig,
        {"harness": {"command": ["agent"]}, "evaluator": {"type": "exact_match"}, "kubernetes": section},
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("namespace", "Rollouts"),
        ("namespace", "roll_outs"),
        ("namespace", "x" * 64),
        ("workspace_dir", "repo"),  # relative: no mount path, no workingDir
        ("workspace_dir", "/"),
        ("workspace_dir", "/opt/.."),
        ("container_name", "harness"),  # the template's container is "agent"
        ("gateway_url", "10.96.12.7:8000"),  # no scheme: every harness's base URL broken
        ("gateway_url", "ftp://10.96.12.7:8000"),
        ("gateway_url", "http://10.96.12.7:80000"),
    ],
)
def test_a_bad_kubernetes_field_is_refused_naming_it(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"kubernetes(\.|.*){field}"):
        rollout_config({field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "Harness_Egress"),
        ("gateway_namespace", "Gateway"),
        ("dns_namespace", "kube_system"),
        ("gateway_cidr", "10.0.12.7"),  # an address, not a CIDR
        ("gateway_cidr", "10.0.12.7/33"),
        ("gateway_cidr", "gateway.local/32"),
    ],
)
def test_a_bad_network_policy_field_is_refused_naming_it(field: str, value: str) -> None:
    policy: dict[str, Any] = {field: value}
    if field == "gateway_cidr":
        policy["gateway_pod_labels"] = None
    with pytest.raises(ConfigError, match=rf"kubernetes\.network_policy\.{field}"):
        rollout_config(policy=policy)


def test_good_values_load() -> None:
    """Control: the same fields with valid values load."""
    config = rollout_config(
        {"namespace": "rl-rollouts", "workspace_dir": "/repo", "container_name": "agent"},
        policy={"name": "harnessrl.egress", "gateway_namespace": "harnessrl", "dns_namespace": "kube-system"},
    )
    assert config.kubernetes is not None
    assert config.kubernetes.workspace_dir == "/repo"
    cidr = rollout_config(policy={"gateway_pod_labels": None, "gateway_cidr": "10.0.12.7/32"})
    assert cidr.kubernetes is not None and cidr.kubernetes.network_policy is not None
    assert cidr.kubernetes.network_policy.gateway_cidr == "10.0.12.7/32"


@pytest.mark.parametrize("huge", ["1e400", "9" * 400])
def test_a_quantity_too_large_for_a_float_is_a_named_error_not_a_traceback(huge: str) -> None:
    """Bug: ``ephemeral_storage_limit = "1e400"`` (a valid quantity pattern) was computed as
    ``1 * 10 ** 400`` and raised OverflowError out of the config check: a traceback instead of the
    field's name; a template request as large did the same when the config loaded."""
    with pytest.raises(ConfigError, match=r"kubernetes\.ephemeral_storage_limit"):
        rollout_config({"ephemeral_storage_limit": huge})
    template = {
        "spec": {"containers": [{"name": "agent", "resources": {"requests": {"ephemeral-storage": huge}}}]}
    }
    assert rollout_config({"job_template": template}).kubernetes is not None  # the API judges it
