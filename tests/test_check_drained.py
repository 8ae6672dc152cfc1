"""The trainer refuses to update weights on a pause that did not drain (issue 16, bug 2)."""

from __future__ import annotations

import pytest

from harnessrl.client import check_drained
from harnessrl.errors import UpstreamError


def test_a_drained_pause_passes() -> None:
    check_drained({"paused": True, "drained": True, "in_flight": 0}, "http://127.0.0.1:8000")


def test_a_single_gateway_that_did_not_drain_is_named() -> None:
    with pytest.raises(UpstreamError, match=r"http://127.0.0.1:8000 \(2 in flight\)"):
        check_drained({"paused": True, "drained": False, "in_flight": 2}, "http://127.0.0.1:8000")


def test_only_the_peers_that_did_not_drain_are_named() -> None:
    answer = {
        "paused": True,
        "drained": False,
        "gateways": [
            {"url": "self", "drained": True, "in_flight": 0},
            {"url": "http://10.0.0.2:8000", "drained": False, "in_flight": 3},
        ],
    }
    with pytest.raises(UpstreamError) as info:
        check_drained(answer, "http://127.0.0.1:8000")
    assert "http://10.0.0.2:8000 (3 in flight)" in str(info.value)
    assert "127.0.0.1" not in str(info.value)


def test_an_answer_without_drained_is_not_trusted() -> None:
    with pytest.raises(UpstreamError):
        check_drained({"paused": True}, "http://127.0.0.1:8000")


@pytest.mark.parametrize("drained", ["false", "no", 1, [False]])
def test_a_drained_that_is_no_bool_is_not_drained(drained: object) -> None:
    """A proxy or another server answering ``"drained": "false"`` (a truthy string) was taken as
    drained, and the weights changed under calls still in flight."""
    with pytest.raises(UpstreamError, match="did not drain"):
        check_drained({"paused": True, "drained": drained, "in_flight": 1}, "http://127.0.0.1:8000")
