"""Rollout ids reach the control API and the model API whatever they hold: a rollout id starts with
the run's name, which may hold ``#``, ``?``, ``%`` or a space. ``GatewayClient`` and the ``base_url``
the control API hands out percent-encode the id as one path segment (unencoded, ``exp#2-g0-0``
asked for ``/api/rollouts/exp``, and ``a%41`` arrived as ``aA``)."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.errors import UpstreamError

ADMIN_KEY = "test-admin-key"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
# A run named "exp#2", "a b%41" or "r?x" (run.name forbids only "/" and "\\").
ODD_IDS = ["exp#2-g0-0", "a b%41-0", "r?x-0"]


def store_rollout(gateway: Any, rollout_id: str) -> None:
    """A rollout created as a training run creates its rollouts: in the store, with its own id."""
    gateway.store.create_rollout(rollout_id=rollout_id, task={"prompt": "test"})


@pytest.mark.parametrize("rollout_id", ODD_IDS)
def test_the_client_reads_finishes_and_cancels_a_rollout_whose_id_holds_url_delimiters(
    gateway: Any, rollout_id: str
) -> None:
    client = gateway.client
    store_rollout(gateway, rollout_id)
    assert client.get_rollout(rollout_id)["rollout_id"] == rollout_id
    assert client.list_calls(rollout_id) == []
    assert client.finish_rollout(rollout_id, "success", 1.0)["rollout_id"] == rollout_id
    assert gateway.store.get_rollout(rollout_id).status.value == "finished"
    other = f"{rollout_id}-b"
    store_rollout(gateway, other)
    assert client.cancel_rollout(other)["status"] == "cancelled"
    assert gateway.store.get_rollout(rollout_id).status.value == "finished"  # untouched by the cancel


@pytest.mark.parametrize("rollout_id", ODD_IDS)
def test_the_base_url_of_a_rollout_whose_id_holds_url_delimiters_reaches_that_rollout(
    gateway: Any, rollout_id: str
) -> None:
    store_rollout(gateway, rollout_id)
    rollout = gateway.client.get_rollout(rollout_id)
    answer = httpx.post(
        f"{rollout['base_url']}/chat/completions",
        json=CHAT,
        headers={"Authorization": f"Bearer {rollout['api_key']}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-harnessrl-rollout-id"] == rollout_id
    assert [c.rollout_id for c in gateway.client.list_calls(rollout_id)] == [rollout_id]


def test_control_a_plain_rollout_id_is_unchanged_in_its_base_url(gateway: Any) -> None:
    rollout = gateway.rollout(rollout_id="plain-0")
    assert rollout["base_url"] == f"{gateway.url}/rollouts/plain-0/v1"
    assert gateway.client.get_rollout("plain-0")["rollout_id"] == "plain-0"


def test_metrics_of_a_gateway_that_cannot_be_reached_is_an_upstream_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with GatewayClient(f"http://127.0.0.1:{port}", ADMIN_KEY, timeout=10) as client:
        with pytest.raises(UpstreamError, match="unreachable"):
            client.metrics()
        with pytest.raises(UpstreamError, match="unreachable"):  # as every other method
            client.state()


@pytest.mark.parametrize("rollout_id", [".", ".."])
def test_a_rollout_id_that_is_a_dot_segment_is_refused(gateway: Any, rollout_id: str) -> None:
    """``..`` as an id made a rollout no URL reaches (``/api/rollouts/..`` is ``/api``) and whose
    attempt folder was the run folder itself: a 400 naming the field, and nothing created."""
    answer = httpx.post(
        f"{gateway.url}/api/rollouts",
        json={"task": {}, "rollout_id": rollout_id},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert answer.status_code == 400, answer.text
    assert "rollout_id" in answer.text
    assert gateway.store.list_rollouts() == []
    dotted = gateway.rollout(rollout_id=f"{rollout_id}a")  # dots inside an id stay allowed (control)
    assert dotted["rollout_id"] == f"{rollout_id}a"
