"""Isolation for harness processes: a network namespace that reaches only the gateway, resource
limits (cgroups where writable, rlimits otherwise), and workspaces with hidden git history."""
