"""The web dashboard: runs, rollouts and token-level traces, server-rendered, read-only, admin-only.

Mounted at ``/ui`` in a gateway by whoever composes it (``create_app(...,
extra_routes=[gateway_dashboard])``: the CLI, ``python -m harnessrl.gateway``, a training run's local
stack) or served alone for a run folder (``create_dashboard_app``, the ``harnessrl dashboard``
command). See ``docs/dashboard.md``.
"""

from harnessrl.dashboard.app import Dashboard, create_dashboard_app, dashboard_mount, gateway_dashboard

__all__ = ["Dashboard", "create_dashboard_app", "dashboard_mount", "gateway_dashboard"]
