"""The NetworkPolicies that confine harness pods: no ingress, egress only to their run's gateway
(and, only if asked for, cluster DNS: it forwards outside names, a way out through the names a pod
looks up).

Two policies, because NetworkPolicies are additive (a pod may reach whatever any policy selecting
it allows) and several runs, with different gateways, may share a namespace:

- the namespace's **baseline** (``build_baseline_policy``, the configured name): every harnessrl
  pod, no ingress, no egress. Every run writes the same one, so no run's start can change what
  another run's pods may reach, and a pod of a run whose own policy is missing stays shut;
- each run's **allow-list** (``build_network_policy``, named by ``run_policy_name``): the pods of
  that run only (its run label), egress to its gateway. One shared allow-list selecting every
  harnessrl pod was replaced by each run's start with its own gateway, cutting the other runs'
  pods off theirs (their harnesses failed, scored as the policy's failures).

Pure: dicts in the networking.k8s.io/v1 shape, no client import. The runner ensures both at start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from harnessrl.controller.kubernetes.names import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from harnessrl.errors import ConfigError

DEFAULT_DNS_POD_LABELS = {"k8s-app": "kube-dns"}
# A NetworkPolicy's name is a DNS-1123 subdomain: at most 253 characters.
_NAME_MAX = 253
_RUN_DIGEST_LEN = 10


def run_policy_name(base: str, run_id: str) -> str:
    """The name of run ``run_id``'s allow-list: ``base`` plus a hash of the exact run id, so runs
    never share (and replace) each other's. Deterministic: a restarted controller of the run, or
    another controller sharing it, ensures the same policy."""
    digest = hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:_RUN_DIGEST_LEN]
    prefix = base[: _NAME_MAX - _RUN_DIGEST_LEN - 1].rstrip("-.")
    return f"{prefix}-{digest}"


def build_baseline_policy(namespace: str, *, name: str = "harnessrl-harness-egress") -> dict[str, Any]:
    """Every harnessrl pod of ``namespace``: all ingress and all egress denied. The runs'
    allow-lists add to it; alone it shuts a pod in (a pod no allow-list selects has no way out)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
        "spec": {
            "podSelector": {"matchLabels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],  # listed in policyTypes with no rules: all denied
            "egress": [],
        },
    }


def build_network_policy(
    namespace: str,
    *,
    gateway_port: int,
    gateway_pod_labels: Mapping[str, str] | None = None,
    gateway_namespace: str | None = None,
    gateway_cidr: str | None = None,
    allow_dns: bool = False,
    dns_namespace: str = "kube-system",
    dns_pod_labels: Mapping[str, str] | None = None,
    name: str = "harnessrl-harness-egress",
    pod_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Deny all ingress to harness pods and all egress except TCP ``gateway_port`` on the gateway
    (selected by pod labels, optionally in another namespace, or by a CIDR) and, if ``allow_dns``,
    port 53 on the cluster DNS pods. Selects pods by the managed-by label plus ``pod_labels`` (the
    runner passes its run's labels: a run's allow-list, ``run_policy_name``)."""
    if (gateway_pod_labels is None) == (gateway_cidr is None):
        raise ConfigError("network policy: set exactly one of gateway_pod_labels or gateway_cidr")
    # An empty matchLabels selects every pod of the namespace.
    if gateway_pod_labels is not None and not gateway_pod_labels:
        raise ConfigError("network policy: gateway_pod_labels is empty, which selects every pod")
    if dns_pod_labels is not None and not dns_pod_labels:
        raise ConfigError("network policy: dns_pod_labels is empty, which selects every pod")
    if gateway_cidr is not None:
        peer: dict[str, Any] = {"ipBlock": {"cidr": gateway_cidr}}
    else:
        peer = {"podSelector": {"matchLabels": dict(gateway_pod_labels or {})}}  # non-empty: checked above
        if gateway_namespace is not None:  # a bare podSelector only matches the policy's namespace
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": gateway_namespace}}
    egress: list[dict[str, Any]] = [{"to": [peer], "ports": [{"protocol": "TCP", "port": gateway_port}]}]
    if allow_dns:
        dns_peer = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": dns_namespace}},
            "podSelector": {"matchLabels": dict(dns_pod_labels or DEFAULT_DNS_POD_LABELS)},
        }
        egress.append(
            {"to": [dns_peer], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(pod_labels or {}), MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        },
        "spec": {
            "podSelector": {"matchLabels": {**(pod_labels or {}), MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],  # listed in policyTypes with no rules: all ingress denied
            "egress": egress,
        },
    }
