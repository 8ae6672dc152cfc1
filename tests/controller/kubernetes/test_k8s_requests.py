"""A template's request above the limit harnessrl gives the harness container is refused naming the
field: the API server refuses such a pod (``requests: Invalid value: "1": must be less than or equal
to cpu limit``), so every launch of the run failed at the API, one rollout after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.controller.kubernetes.k8s_support import CLUSTER_GATEWAY, build_launch, job_manifest

from harnessrl.controller.base import ResourceLimits
from harnessrl.controller.kubernetes import manifests
from harnessrl.errors import ConfigError


def template(**requests: str) -> dict[str, Any]:
    return {
        "spec": {"containers": [{"name": "harness", "image": "a:1", "resources": {"requests": requests}}]}
    }


def build(tmp_path: Path, tpl: dict[str, Any], limits: ResourceLimits, storage: str | None = "10Gi") -> dict:
    return job_manifest(tpl, build_launch(tmp_path, limits=limits), ephemeral_storage_limit=storage)


@pytest.mark.parametrize(
    ("requests", "limits", "field"),
    [
        ({"cpu": "1"}, ResourceLimits(cpus=0.5), "harness.limits.cpus"),
        ({"memory": "2Gi"}, ResourceLimits(memory_mb=1024), "harness.limits.memory_mb"),
        ({"ephemeral-storage": "20Gi"}, ResourceLimits(), "kubernetes.ephemeral_storage_limit"),
    ],
)
def test_a_request_above_harnessrls_limit_is_refused_naming_the_field(
    tmp_path: Path, requests: dict[str, str], limits: ResourceLimits, field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build(tmp_path, template(**requests), limits)


def test_requests_within_the_limits_are_kept(tmp_path: Path) -> None:
    """Control: requests up to the limits (and limits harnessrl does not set) pass as written."""
    tpl = template(cpu="500m", memory="1Gi", **{"ephemeral-storage": "10Gi"})
    job = build(tmp_path, tpl, ResourceLimits(cpus=0.5, memory_mb=1024))
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "10Gi"}
    # No cpu limit of ours: the template's request stands against nothing harnessrl set.
    build(tmp_path, template(cpu="8"), ResourceLimits(cpus=None))
    # The pure check, for a config loader that has the template and the limits but no launch.
    manifests.check_requests_within_limits(tpl, ResourceLimits(cpus=0.5, memory_mb=1024))


def test_a_storage_request_above_the_limit_is_refused_when_the_config_loads() -> None:
    from harnessrl.config import validate_config
    from harnessrl.controller.stack import RolloutConfig

    section = {
        "gateway_url": CLUSTER_GATEWAY,
        "network_policy": False,
        "ephemeral_storage_limit": "10Gi",
        "job_template": template(**{"ephemeral-storage": "20Gi"}),
    }
    raw = {"harness": {"command": ["agent"]}, "evaluator": {"type": "exact_match"}, "kubernetes": section}
    with pytest.raises(ConfigError, match=r"kubernetes.*ephemeral_storage_limit"):
        validate_config(RolloutConfig, raw)
    section["ephemeral_storage_limit"] = "20Gi"  # control
    validate_config(RolloutConfig, raw)


@pytest.mark.parametrize(
    ("cpus", "quantity"), [(4.03, "4030m"), (8.13, "8130m"), (0.5, "500m"), (2.0, "2"), (1e-4, "1m")]
)
def test_a_cpu_limit_becomes_the_millicores_it_says(tmp_path: Path, cpus: float, quantity: str) -> None:
    """4.03 cpus were 4031m: 4.03 * 1000 is 4030.0000000000005 in floating point, rounded up."""
    job = build(tmp_path, template(), ResourceLimits(cpus=cpus))
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == quantity
