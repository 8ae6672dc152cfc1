"""Controlling the gateway: the control API and the pause gate, in this process and across gateways.

- ``api``: the routes under ``/api`` (admin key): rollouts created, listed, finished and cancelled,
  pause and resume, state, health and metrics.
- ``pause``: the pause gate every model call takes a ticket from before it generates.
- ``gating``: pausing and resuming every gateway sharing the store (the control API and an
  in-process trainer both go through it).
- ``cluster`` and ``heartbeat``: one gateway's side of the gate in the store (its state, the
  commands it applies, its acks and lease).
"""
