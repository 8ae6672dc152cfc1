"""A rollout's ``metadata.sampling`` (set by the trainer) overrides what the harness asks for: the
temperature the trainer's log-probs assume, greedy evaluation, and a cap on new tokens."""

from __future__ import annotations

import openai

from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.engines.factory import create_engine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore

ADMIN = "admin-key"


def test_rollout_sampling_overrides_the_harness(tmp_path):
    from harnessrl.client import GatewayClient

    store = SQLiteStore(tmp_path / "db.sqlite")
    app = create_app(GatewayConfig(admin_key=ADMIN), store, create_engine(EngineConfig(model="tiny")))
    with serve_in_thread(app) as url:
        admin = GatewayClient(url, ADMIN)
        greedy = admin.create_rollout({}, metadata={"sampling": {"temperature": 0.0, "max_tokens": 5}})
        client = openai.OpenAI(base_url=greedy["base_url"], api_key=greedy["api_key"], max_retries=0)
        texts = []
        for _ in range(3):
            reply = client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "hi"}], temperature=2.0, max_tokens=50
            )
            texts.append(reply.choices[0].message.content)
            assert reply.usage.completion_tokens <= 5
        assert len(set(texts)) == 1  # greedy despite the harness's temperature 2.0
        calls = admin.list_calls(greedy["rollout_id"])
        assert all(len(c.response_token_ids) <= 5 for c in calls)
        admin.close()
    store.close()
