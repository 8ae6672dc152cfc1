"""Kubernetes runner: one batch/v1 Job per rollout attempt, a Secret for its key, a NetworkPolicy.

``manifests``, ``pod_security``, ``network_policy``, ``names``, ``observed``, ``reconcile``,
``attempts``, ``api_errors`` and ``config`` are pure (no client import). The client layer imports
``kubernetes``: ``runner`` (the public ``KubernetesRunner``) and the parts it is built from,
``reconcile_loop`` (list, plan, execute), ``job_creator``, ``job_watch``, ``endings``,
``policy_keeper`` and ``api``. Only ``runner`` is imported on first use of ``KubernetesRunner``, so importing this package
stays cheap.
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
