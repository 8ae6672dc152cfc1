"""The HTTP edge: provider-compatible model APIs per rollout, the control API, token-exact recording."""

from harnessrl.gateway.app import create_app

__all__ = ["create_app"]
