"""Keeping the namespace's NetworkPolicies as configured: the deny-all baseline and a run's allow-list.

``network_policy`` builds the manifests (pure); this module makes the API hold them. Every runner of
the namespace ensures the same baseline at its start, so creates meet ``409 AlreadyExists`` and
replaces meet ``409 Conflict``: a policy is created, or read, compared as the server stores it, and
replaced only when its spec differs.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from harnessrl.controller.kubernetes.api import KubeApi
from harnessrl.controller.kubernetes.names import MANAGED_BY_LABEL, run_labels
from harnessrl.controller.kubernetes.network_policy import (
    build_baseline_policy,
    build_network_policy,
    run_policy_name,
)
from harnessrl.errors import ConfigError

log = logging.getLogger(__name__)

# Reads and replaces of a NetworkPolicy that another runner replaced in between (409 Conflict).
POLICY_REPLACE_TRIES = 3


def as_stored(spec: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy spec as the API server gives it back: its empty lists (``ingress: []``) left
    out (Go's ``omitempty``). Compared raw, every start found the policy "changed" and replaced it."""
    return {key: value for key, value in spec.items() if value != []}


class NetworkPolicyKeeper:
    """The policies of one run. ``owns_run`` (the runner drew its run id): no other controller can
    share the run, so the run's allow-list is deleted when the runner closes."""

    def __init__(self, api: KubeApi, run_id: str, *, owns_run: bool) -> None:
        self._api = api
        self._run_id = run_id
        self._owns_run = owns_run
        self._run_policy_made = False  # this run's allow-list was ensured (close may delete it)

    async def ensure(self) -> None:
        """The namespace's deny-all baseline, then this run's allow-list (``network_policy``): in
        that order, so no pod of this run is ever selected by an allow-list alone."""
        np = self._api.config.network_policy
        assert np is not None
        namespace = self._api.config.namespace
        await self._ensure_policy(build_baseline_policy(namespace, name=np.name))
        labels = run_labels(self._run_id)
        labels.pop(MANAGED_BY_LABEL)  # build_network_policy adds it
        await self._ensure_policy(
            build_network_policy(
                namespace,
                gateway_port=np.gateway_port,
                gateway_pod_labels=np.gateway_pod_labels,
                gateway_namespace=np.gateway_namespace,
                gateway_cidr=np.gateway_cidr,
                allow_dns=np.allow_dns,
                dns_namespace=np.dns_namespace,
                dns_pod_labels=np.dns_pod_labels,
                name=run_policy_name(np.name, self._run_id),
                pod_labels=labels,
            )
        )
        self._run_policy_made = True

    async def _ensure_policy(self, desired: dict[str, Any]) -> None:
        """Create ``desired``, or replace the policy of its name if its spec differs. A replace may
        meet another runner's (409 Conflict): the policy is read and compared again, a few times."""
        api, ns, name = self._api, self._api.config.namespace, desired["metadata"]["name"]
        try:
            try:
                await api.json(api.net.create_namespaced_network_policy, ns, desired)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            for tries in range(1, POLICY_REPLACE_TRIES + 1):
                current = await api.json(api.net.read_namespaced_network_policy, name, ns)
                if as_stored(current.get("spec") or {}) == as_stored(desired["spec"]):
                    return
                replacement = copy.deepcopy(desired)  # converge to this config's allow-list
                replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                try:
                    await api.json(api.net.replace_namespaced_network_policy, name, ns, replacement)
                    return
                except ApiException as exc:
                    if exc.status != 409 or tries == POLICY_REPLACE_TRIES:
                        raise
        except ApiException as exc:
            raise ConfigError(f"cannot ensure NetworkPolicy {name!r}: {exc.status} {exc.reason}") from exc

    async def delete_run_policy(self) -> None:
        """Delete this run's allow-list when the runner drew its run id: every runner start would
        otherwise leave one more policy behind."""
        np = self._api.config.network_policy
        if np is None or not self._owns_run or not self._run_policy_made:
            return
        try:
            await self._api.delete(
                self._api.net.delete_namespaced_network_policy, run_policy_name(np.name, self._run_id)
            )
        except Exception as exc:  # deliberate: it selects no pod any more; only clutter is left
            log.warning("could not delete the run's NetworkPolicy: %s", exc)
