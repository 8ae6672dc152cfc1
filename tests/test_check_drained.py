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
