"""The harness container's resources in a Job: the limits harnessrl gives it (``harness.limits``,
``kubernetes.ephemeral_storage_limit``) and the check that the template's requests stay within them
(the API refuses a pod whose request is above its limit, every launch in turn).

Pure functions over plain dicts, apart from ``manifests`` so that the config can check its
template when it loads without importing the manifest builder (which imports the config).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harnessrl.controller.base import ResourceLimits
from harnessrl.controller.kubernetes.job_template import normalize_template
from harnessrl.controller.kubernetes.observed import parse_quantity
from harnessrl.errors import ConfigError


def harness_container(pod_spec: dict[str, Any], container_name: str | None) -> dict[str, Any]:
    containers = pod_spec["containers"]
    wanted = container_name or "harness"
    for container in containers:
        if container.get("name") == wanted:
            return container
    if container_name:
        raise ConfigError(f"job_template has no container named {container_name!r}")
    return containers[0]


def quantity_cpu(cpus: float) -> str:
    # round first: 4.03 * 1000 is 4030.0000000000005 in floating point, and ceil made it 4031m.
    return str(int(cpus)) if float(cpus).is_integer() else f"{math.ceil(round(cpus * 1000, 6))}m"


def apply_limits(container: dict[str, Any], limits: ResourceLimits) -> None:
    resources = container.setdefault("resources", {})
    container_limits = resources.setdefault("limits", {})
    if limits.memory_mb is not None:
        container_limits["memory"] = f"{limits.memory_mb}Mi"
    if limits.cpus is not None:
        container_limits["cpu"] = quantity_cpu(limits.cpus)
    # cpu_seconds and max_processes have no per-pod field: the pod's pids limit is kubelet config.


def apply_storage_limit(container: dict[str, Any], limit: str) -> None:
    """The harness container's ephemeral-storage limit (the kubelet evicts a pod over it, and counts
    the pod's emptyDirs against the sum of its containers' limits)."""
    resources = container.setdefault("resources", {})
    resources.setdefault("limits", {})["ephemeral-storage"] = limit
    # A missing request defaults to the limit, and the scheduler would then reserve the whole limit
    # on a node for every attempt; no request (0) schedules as before. The template's request stays.
    resources.setdefault("requests", {}).setdefault("ephemeral-storage", "0")


# Where each limit harnessrl gives the harness container comes from.
_LIMIT_FIELDS = {
    "memory": "harness.limits.memory_mb",
    "cpu": "harness.limits.cpus",
    "ephemeral-storage": "kubernetes.ephemeral_storage_limit",
}


def check_requests_within_limits(
    template: Mapping[str, Any] | None,
    limits: ResourceLimits,
    *,
    container_name: str | None = None,
    ephemeral_storage_limit: str | None = None,
) -> None:
    """A ``ConfigError`` naming the field if the template's harness container requests more of a
    resource than the limit harnessrl gives it: the API refuses such a pod (``must be less than or
    equal to memory limit``), every launch in turn. Pure: ``harnessrl controller`` can check it when
    the config loads (harness limits and template together); the manifest builder checks it anyway."""
    container = harness_container(normalize_template(template)["spec"]["template"]["spec"], container_name)
    ours: dict[str, Any] = {}  # the limits harnessrl sets (the template's own stay as written)
    apply_limits(ours, limits)
    if ephemeral_storage_limit is not None:
        apply_storage_limit(ours, ephemeral_storage_limit)
    requests = (container.get("resources") or {}).get("requests") or {}
    for resource, limit in ours["resources"]["limits"].items():
        request = requests.get(resource)
        wanted, allowed = parse_quantity(request), parse_quantity(limit)
        if wanted is not None and allowed is not None and wanted > allowed:
            raise ConfigError(
                f"{_LIMIT_FIELDS[resource]}: the limit it gives the harness container ({limit}) is below "
                f"the {resource} request of job_template's container {container.get('name') or 'harness'!r} "
                f"({request}); Kubernetes refuses a request above its limit: lower the request or raise "
                "the limit"
            )
