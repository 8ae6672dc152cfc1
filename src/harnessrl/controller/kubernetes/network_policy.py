"""The NetworkPolicy that confines harness pods: no ingress, egress only to the gateway (and, only
if asked for, cluster DNS: it forwards outside names, a way out through the names a pod looks up).

Pure: a dict in the networking.k8s.io/v1 shape, no client import. The runner ensures it at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harnessrl.controller.kubernetes.names import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from harnessrl.errors import ConfigError

DEFAULT_DNS_POD_LABELS = {"k8s-app": "kube-dns"}


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
    port 53 on the cluster DNS pods. Selects pods by the managed-by label (plus ``pod_labels``)."""
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
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
        "spec": {
            "podSelector": {"matchLabels": {**(pod_labels or {}), MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],  # listed in policyTypes with no rules: all ingress denied
            "egress": egress,
        },
    }
