"""A trace's conversation is bounded whatever the harness sent: the gateway caps a request's text, not
its JSON, and an item of a type the converter skips costs no text at all. Written as indented JSON, a
1 MB body of nested numbers became a 43 MB page; 100k such items, 25 MB. The bodies go through a
real gateway (which accepts and records them) with the dashboard mounted. An evaluator's output is
cut the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.dashboard import create_dashboard_app, gateway_dashboard
from harnessrl.dashboard.conversation import MAX_CONVERSATION_CHARS, MAX_JSON_CHARS
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Outcome
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
FIRST = {"type": "message", "role": "user", "content": "FIRST-MESSAGE"}
LAST = {"type": "message", "role": "user", "content": "LAST-MESSAGE"}


def _skipped(i: int, **extra: Any) -> dict[str, Any]:
    """A Responses item the gateway accepts and its converter skips (no text reaches the prompt)."""
    return {"type": "web_search_call", "id": f"ws{i}", "status": "completed", **extra}


def _nested(depth: int, width: int) -> Any:
    value: Any = [0] * width
    for _ in range(depth):
        value = [value]
    return value


#: name -> Responses input; "many" holds 60,000 skipped items between two real messages.
BODIES: dict[str, list[Any]] = {
    "deep": [FIRST, _skipped(0, x=_nested(40, 200_000)), LAST],
    "many": [FIRST, *(_skipped(i) for i in range(60_000)), LAST],
    "small": [FIRST, _skipped(0), _skipped(1), LAST],  # control: shown whole, indented
}


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, httpx.Response]]:
    """The trace page of a rollout that sent each of ``BODIES`` through a real gateway."""
    store = SQLiteStore(tmp_path_factory.mktemp("size") / "harnessrl.db")
    engine = ScriptedEngine(["Hello!"], PolicyTokenizer.from_dir(tiny_model_dir(weights=False)))
    # The tiny model's context would cap the text at 64k characters; a real model's allows far more.
    config = GatewayConfig(admin_key=ADMIN_KEY, max_prompt_chars=10_000_000)
    app = create_app(config, store, engine, extra_routes=[gateway_dashboard])
    with (
        serve_in_thread(app) as url,
        GatewayClient(url, ADMIN_KEY) as client,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        found = {}
        for name, items in BODIES.items():
            rollout = client.create_rollout({"prompt": name})
            sent = http.post(
                "/v1/responses",
                content=json.dumps({"input": items}),
                headers={"Authorization": f"Bearer {rollout['api_key']}", "content-type": "application/json"},
            )
            assert sent.status_code == 200, sent.text[:300]  # recorded as sent
            found[name] = http.get(f"/ui/rollouts/{rollout['rollout_id']}", headers=ADMIN)
        yield found
    store.close()


def test_json_that_costs_no_text_is_cut_not_indented(pages: dict[str, httpx.Response]) -> None:
    page = pages["deep"]
    assert page.status_code == 200 and len(page.text) < 2 * MAX_JSON_CHARS + 100_000
    assert f"cut: the dashboard shows {MAX_JSON_CHARS:,} characters of it" in page.text
    assert "<pre>FIRST-MESSAGE</pre>" in page.text and "<pre>LAST-MESSAGE</pre>" in page.text
    # Control: a small item is shown whole, indented as before.
    small = pages["small"].text
    assert "\n  &quot;status&quot;: &quot;completed&quot;" in small and "cut:" not in small


def test_a_conversation_of_many_items_shows_its_first_and_last_messages(
    pages: dict[str, httpx.Response],
) -> None:
    page = pages["many"]
    assert page.status_code == 200 and len(page.text) < MAX_CONVERSATION_CHARS + 100_000
    assert "<pre>FIRST-MESSAGE</pre>" in page.text and "<pre>LAST-MESSAGE</pre>" in page.text
    assert "messages not shown: a conversation is shown in at most 4,000,000 characters" in page.text
    assert "&quot;ws0&quot;" in page.text and "&quot;ws59999&quot;" in page.text  # its first and last items
    # Control: a short conversation is shown whole.
    small = pages["small"].text
    assert (
        "messages not shown" not in small
        and "&quot;ws1&quot;" in small
        and "<pre>LAST-MESSAGE</pre>" in small
    )


def test_a_large_evaluator_output_is_cut(tmp_path: Path) -> None:
    """A command scorer's JSON verdict is stored as ``metadata.evaluation.output`` (up to 1 MiB of
    its stdout, nested up to 32 deep); the trace shows at most ``MAX_JSON_CHARS`` of it."""
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_run("run", {})
    for rollout_id, output in (("big", _nested(31, 300_000)), ("small", {"passed": 3})):
        store.create_rollout(rollout_id=rollout_id, run_id="run")
        store.start_rollout(rollout_id)
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0, metadata={"evaluation": {"output": output}})
    store.close()
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY)) as client:
        big = client.get("/ui/rollouts/big", headers=ADMIN)
        assert big.status_code == 200 and len(big.text) < 2 * MAX_JSON_CHARS + 100_000
        assert f"cut: the dashboard shows {MAX_JSON_CHARS:,} characters of it" in big.text
        small = client.get("/ui/rollouts/small", headers=ADMIN).text  # control: shown whole, indented
        assert "\n    &quot;passed&quot;: 3" in small and "cut:" not in small
