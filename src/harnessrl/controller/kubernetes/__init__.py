"""Kubernetes runner: one batch/v1 Job per rollout attempt, a Secret for its key, a NetworkPolicy.

``manifests``, ``pod_security``, ``network_policy``, ``names``, ``observed``, ``reconcile`` and ``config``
are pure (no client import); ``runner`` is the thin client layer and the only module importing
``kubernetes``, so importing this package stays cheap until ``KubernetesRunner`` is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harnessrl.controller.kubernetes.config import KubernetesRunnerConfig, NetworkPolicyConfig

if TYPE_CHECKING:
    from harnessrl.controller.kubernetes.runner import KubernetesRunHandle, KubernetesRunner

__all__ = ["KubernetesRunHandle", "KubernetesRunner", "KubernetesRunnerConfig", "NetworkPolicyConfig"]


def __getattr__(name: str) -> Any:
    if name in ("KubernetesRunner", "KubernetesRunHandle"):
        from harnessrl.controller.kubernetes import runner

        return getattr(runner, name)
    raise AttributeError(name)
