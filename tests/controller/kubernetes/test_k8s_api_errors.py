"""``api_errors``: which API refusals the runner waits out and which fail the launch as the config's.

Pure functions of the client's own ``ApiException`` with the Status bodies an API server sends; the
runner tests drive the same refusals through the fake API server.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from harnessrl.controller.kubernetes.api_errors import is_transient, list_error, never_fits, status_message
from harnessrl.errors import ConfigError, UpstreamError


def refusal(status: int, message: str, *, as_bytes: bool = False) -> ApiException:
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": status})
    return ApiException(status=status, reason="Refused", body=body.encode() if as_bytes else body)


FULL = (
    'jobs.batch "x" is forbidden: exceeded quota: rollouts, requested: requests.memory=1Gi, '
    "used: requests.memory=7Gi, limited: requests.memory=8Gi"
)
TOO_SMALL = (
    'jobs.batch "x" is forbidden: exceeded quota: tight, requested: requests.memory=2Gi, '
    "used: requests.memory=0, limited: requests.memory=1Gi"
)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (refusal(429, "too many requests"), True),
        (refusal(500, "admission webhook failed"), True),
        (refusal(403, FULL), True),  # other Jobs ending free a full quota
        (refusal(403, FULL, as_bytes=True), True),
        (refusal(403, TOO_SMALL), False),  # one attempt alone asks for more than the hard limit
        (refusal(403, "failed quota: compute: must specify limits.cpu"), False),
        (refusal(403, 'jobs.batch is forbidden: User "x" cannot create'), False),
        (refusal(422, "spec.template: Invalid value"), False),
    ],
)
def test_which_refusals_pass_by_themselves(exc: ApiException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_a_quota_with_quantities_that_do_not_parse_is_waited_out() -> None:
    """A quantity the parser does not know is no proof the quota can never fit."""
    assert not never_fits("exceeded quota: q, requested: cpu=lots, used: cpu=1, limited: cpu=1")
    assert not never_fits("exceeded quota: q")  # no lists at all (older servers)


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "", None])
def test_a_body_that_is_no_status_has_no_message(body: str | None) -> None:
    assert status_message(ApiException(status=500, reason="Internal", body=body)) == ""


def test_a_refused_first_list_names_the_namespace_and_what_to_grant() -> None:
    forbidden = list_error(refusal(403, "jobs.batch is forbidden: cannot list"), "rl")
    assert isinstance(forbidden, ConfigError)
    assert "'rl'" in str(forbidden) and "cannot list" in str(forbidden) and "RBAC" in str(forbidden)
    throttled = list_error(refusal(429, "slow down"), "rl")
    assert isinstance(throttled, UpstreamError) and "slow down" in str(throttled)
