"""How the runner reads the API's refusals: which pass by themselves and which are the config's.

Pure functions of an ``ApiException`` (its status and Status body); the client is imported only for
its type. A refusal that passes by itself (throttling, a server error, a full ResourceQuota) is
retried; any other is reported as a ``ConfigError`` naming what the API said.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from harnessrl.controller.kubernetes.observed import parse_quantity
from harnessrl.errors import ConfigError, UpstreamError

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

# The quota admission's refusal: "exceeded quota: <name>, requested: k=v,..., used: ..., limited: ..."
_QUOTA_LISTS = re.compile(r"requested: ([^\s\"]*), used: ([^\s\"]*), limited: ([^\s\"]*)")


def status_message(exc: ApiException) -> str:
    """The ``message`` of the API's Status body, if it sent one."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except ValueError:
        return ""
    return str(body.get("message") or "") if isinstance(body, dict) else ""


def describe(exc: ApiException) -> str:
    """``403 Forbidden <the Status message>``: the refusal as one line for an error or a log."""
    return f"{exc.status} {exc.reason} {status_message(exc)}".strip()


def _quantities(listed: str) -> dict[str, float | None]:
    pairs = (item.split("=", 1) for item in listed.split(",") if "=" in item)
    return {key: parse_quantity(value) for key, value in pairs}


def never_fits(body: str) -> bool:
    """A quota refusal where one attempt alone asks for more than the quota's hard limit (``requested:
    count/jobs.batch=1 ... limited: count/jobs.batch=0``): no other Job ending will ever free that."""
    match = _QUOTA_LISTS.search(body)
    if match is None:
        return False
    requested, limited = _quantities(match.group(1)), _quantities(match.group(3))
    return any(
        wanted is not None and (hard := limited.get(key)) is not None and wanted > hard
        for key, wanted in requested.items()
    )


def is_transient(exc: ApiException) -> bool:
    """An API refusal that passes by itself: throttling, a server error, a ResourceQuota that is
    full now (``403 ... exceeded quota``: other pods end and free it). A quota that forbids the pod
    outright (``must specify limits``), one whose hard limit is below what one attempt asks for, or
    any other 4xx is the config's fault."""
    if exc.status == 429 or exc.status >= 500:
        return True
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return exc.status == 403 and "exceeded quota" in body and not never_fits(body)


def list_error(exc: ApiException, namespace: str) -> ConfigError | UpstreamError:
    """A first list the API refused, as a clear error (it reached ``launch`` as a bare
    ``ApiException``): throttled or a server error (``UpstreamError``, the next launch tries
    again), else the config's (no RBAC to list jobs, secrets or pods; ``ConfigError``)."""
    where = f"in namespace {namespace!r}"
    what = describe(exc)
    if is_transient(exc):
        return UpstreamError(
            f"Kubernetes API could not list the run's Jobs, Secrets and pods {where}: {what}"
        )
    return ConfigError(
        f"cannot list the run's Jobs, Secrets and pods {where}: {what} (the service account needs "
        "jobs list/watch, secrets list and pods list there: docs/kubernetes.md, RBAC)"
    )
