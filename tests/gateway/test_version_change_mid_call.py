"""A call during which the engine's policy version changed is not recorded under the version it
started with (its tokens are of two versions): it ends as the engine cutting it short would, 503
``engine_aborted`` (an error event once a stream's 200 went out), and nothing is recorded; the
harness sends it again. A pause drains calls before the weights change; this happens when a resume
from elsewhere (another run on the store, an admin) opens the gate while a trainer loads weights."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = "version-admin"
ANSWER = "one two three four five six seven eight nine ten eleven twelve"


def change_version_after(engine: ScriptedEngine, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), engine.adopt_policy_version(1)))
    thread.start()
    return thread


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("changed", [True, False], ids=["version-changed", "control"])
def test_a_call_spanning_a_version_change_is_not_recorded(tmp_path, stream, changed):
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    engine = ScriptedEngine([{"content": ANSWER}], tokenizer, token_delay_s=0.05)
    store = SQLiteStore(tmp_path / "db.sqlite")
    app = create_app(GatewayConfig(admin_key=ADMIN), store, engine)
    with serve_in_thread(app) as url, GatewayClient(url, ADMIN) as client:
        rollout = client.create_rollout({"prompt": "count"})
        body = {"model": "m", "messages": [{"role": "user", "content": "count"}], "stream": stream}
        headers = {"Authorization": f"Bearer {rollout['api_key']}"}
        # The answer takes >= 0.05 s a token (many tokens): the version changes well inside it.
        changer = change_version_after(engine, 0.3) if changed else None
        with httpx.Client(base_url=rollout["base_url"], headers=headers, timeout=60) as http:
            reply = http.post("/chat/completions", json=body)
        if changer is not None:
            changer.join()
        calls = store.list_calls(rollout["rollout_id"])
    store.close()
    if not changed:
        assert reply.status_code == 200 and len(calls) == 1 and calls[0].policy_version == 0
        assert "error" not in reply.text
        return
    assert calls == []
    if stream:
        assert reply.status_code == 200 and "engine_aborted" in reply.text, reply.text
    else:
        assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_aborted", reply.text
