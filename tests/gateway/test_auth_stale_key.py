"""A rollout key opens one attempt, even when the attempt moves on while its call is being let in:
the gateway starts only the attempt the key was read for."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import RolloutStatus
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN_KEY = "test-admin-key"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class RetriedAfterKeyRead(SQLiteStore):
    """The gateway's store, with a controller's claim and requeue of the rollout (another process,
    through its own handle) landing right after the gateway read the rollout by its key: the window
    between ``authorize_rollout`` and ``open_rollout``, made deterministic."""

    controller: SQLiteStore | None = None

    def get_rollout_by_key(self, key: str) -> Any:
        rollout = super().get_rollout_by_key(key)
        if self.controller is not None:
            controller, self.controller = self.controller, None
            [claimed] = controller.claim_rollouts("w1", 1)
            controller.requeue_rollout(claimed.rollout_id, error="sandbox died", attempt=claimed.attempt)
        return rollout


def test_a_key_read_before_a_claim_and_requeue_does_not_start_the_next_attempt(
    tokenizer: PolicyTokenizer, tmp_path: Path
) -> None:
    """The stale key's call is refused (409, the rollout ended for it): the requeued attempt stays
    queued for a worker, and records no call its harness never made. It was started with no worker
    to run it, and the stale harness's call recorded as the new attempt's."""
    path = tmp_path / "store.db"
    store, controller = RetriedAfterKeyRead(path), SQLiteStore(path)
    engine = ScriptedEngine(["Hello!"], tokenizer)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
    with contextlib.ExitStack() as stack:
        stack.callback(controller.close)
        stack.callback(store.close)
        url = stack.enter_context(serve_in_thread(app))
        rollout = store.create_rollout(task={"prompt": "test"})
        store.controller = controller
        response = httpx.post(
            f"{url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": f"Bearer {rollout.api_key}"},
        )
        assert response.status_code == 409, response.text
        assert "has ended" in response.json()["error"]["message"]
        now = store.get_rollout(rollout.rollout_id)
        assert (now.status, now.attempt, now.worker_id) == (RolloutStatus.QUEUED, 1, None)
        assert store.list_calls(rollout.rollout_id) == []
