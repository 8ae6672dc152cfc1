"""A rollout's requests are the policy's (and its harness's) doing: adversarial by the threat model.
Nothing a rollout sends may fail its trace or compare page, hide what it sent the policy, or make
a page (or the work behind it) as large as it likes. The gateway records extra keys as sent, so the
bodies below go through a real gateway with the dashboard mounted."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import escape as html_escape
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, _call, build_crafted

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.dashboard import create_dashboard_app, gateway_dashboard
from harnessrl.dashboard.conversation import conversation_html, message_html
from harnessrl.dashboard.token_view import calls_table
from harnessrl.dashboard.trace_calls import CallRow
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer
from harnessrl.trajectory import build_rollout_samples

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

#: (route, body) a rollout sends; each body the gateway accepts and records as sent.
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    # Extra keys of the wrong type where the trace once read tool calls.
    "tool_calls_int": (
        "/v1/responses",
        {"input": [{"type": "message", "role": "user", "content": "hi-int", "tool_calls": 1}]},
    ),
    "function_str": (
        "/v1/messages",
        {"max_tokens": 8, "messages": [{"role": "user", "content": "hi-str", "tool_calls": [{"function": "x"}]}]},
    ),
    # Typed items with an extra "content" that once stood in for their real fields.
    "spoofed_items": (
        "/v1/responses",
        {
            "input": [
                {"type": "message", "role": "user", "content": "list the files"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "bash",
                    "arguments": '{"cmd": "rm -rf REAL-ARGS"}',
                    "content": "SPOOFED-CALL",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "REAL-OUTPUT", "content": "SPOOFED-OUT"},
            ]
        },
    ),
    "spoofed_blocks": (
        "/v1/messages",
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "go", "tool_calls": [{"function": {"name": "SPOOFED-GHOST", "arguments": "{}"}}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "t1", "name": "bash", "input": {"cmd": "BLOCK-ARGS"}, "text": "SPOOFED-USE"},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "BLOCK-RESULT", "text": "SPOOFED-RES"}],
                },
            ],
        },
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """A gateway (dashboard mounted) where one rollout sent each of ``BODIES``: an admin client, and
    the rollout id of each body."""
    store = SQLiteStore(tmp_path_factory.mktemp("hostile") / "harnessrl.db")
    engine = ScriptedEngine(["Hello!"], PolicyTokenizer.from_dir(tiny_model_dir(weights=False)))
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine, extra_routes=[gateway_dashboard])
    with (
        serve_in_thread(app) as url,
        GatewayClient(url, ADMIN_KEY) as client,
        httpx.Client(base_url=url) as http,
    ):
        ids = {}
        for name, (route, body) in BODIES.items():
            rollout = client.create_rollout({"prompt": name})
            sent = http.post(route, json=body, headers={"Authorization": f"Bearer {rollout['api_key']}"})
            assert sent.status_code == 200, sent.text  # recorded as sent, extra keys included
            ids[name] = rollout["rollout_id"]
        yield http, ids
    store.close()


@pytest.mark.parametrize(("name", "text"), [("tool_calls_int", "hi-int"), ("function_str", "hi-str")])
def test_odd_shapes_in_a_request_body_never_fail_the_trace(
    hostile: tuple[httpx.Client, dict[str, str]], name: str, text: str
) -> None:
    http, ids = hostile
    page = http.get(f"/ui/rollouts/{ids[name]}", headers=ADMIN)
    assert page.status_code == 200 and f"<pre>{text}</pre>" in page.text


def test_odd_shapes_in_a_request_body_never_fail_the_compare(
    hostile: tuple[httpx.Client, dict[str, str]],
) -> None:
    http, ids = hostile
    params = {"a": ids["tool_calls_int"], "b": ids["function_str"]}
    compare = http.get("/ui/compare", params=params, headers=ADMIN)
    assert compare.status_code == 200 and compare.text.count('class="side"') == 2
    assert "<pre>hi-int</pre>" in compare.text and "<pre>hi-str</pre>" in compare.text


def test_typed_items_show_their_real_fields_not_a_spoofed_content(
    hostile: tuple[httpx.Client, dict[str, str]],
) -> None:
    http, ids = hostile
    items = http.get(f"/ui/rollouts/{ids['spoofed_items']}", headers=ADMIN).text
    assert "<b>bash</b><pre>{&quot;cmd&quot;: &quot;rm -rf REAL-ARGS&quot;}</pre>" in items
    assert "<pre>REAL-OUTPUT</pre>" in items and "SPOOFED" not in items
    blocks = http.get(f"/ui/rollouts/{ids['spoofed_blocks']}", headers=ADMIN).text
    assert re.search(r"<b>bash</b><pre>{\s*&quot;cmd&quot;: &quot;BLOCK-ARGS&quot;\s*}</pre>", blocks)
    assert "<pre>BLOCK-RESULT</pre>" in blocks and "SPOOFED" not in blocks


def test_messages_of_any_shape_render_escaped_and_an_unreadable_body_is_shown_raw() -> None:
    odd = [
        {"role": "user", "content": "a", "tool_calls": 1},
        {"role": "assistant", "content": {"x": 1}, "tool_calls": [{"function": "x"}, 3, {"function": {"arguments": {"k": 1}}}]},
        {"role": 5, "content": [{"type": "text", "text": 7}, "<b>", None], "reasoning_content": ["r"]},
        "<i>bare</i>",
    ]  # fmt: skip
    html = "".join(message_html(m) for m in odd)
    assert "<i>" not in html and "&lt;i&gt;bare&lt;/i&gt;" in html and "<pre>&lt;b&gt;</pre>" in html
    assert "&quot;function&quot;: &quot;x&quot;" in html and "&quot;k&quot;: 1" in html
    # The Responses converter refuses this body (input must be a list or a string): shown as sent.
    call = _call("r", [1], [2], 0, api="responses", request={"input": 5, "note": "<x>"})
    shown = conversation_html([call])
    assert "cannot be shown as a conversation" in shown and "&quot;note&quot;: &quot;&lt;x&gt;&quot;" in shown


# -- size: a page and the work behind it are bounded whatever the rollout did -------------------------

CALLS, PROMPT_TOKENS = 32, 12_000  # 384k tokens in 32 samples: none extends another
PAGE_TOKENS = 40_000  # the most tokens a page shows (docs/dashboard.md)


def _many_samples(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    store = SQLiteStore(run_dir / "harnessrl.db")
    store.create_run("run", {"run": {"name": "run"}})
    store.create_rollout(rollout_id="r-big", run_id="run", metadata={"kind": "train"})
    store.start_rollout("r-big")
    for i in range(CALLS):
        store.add_call(_call("r-big", [1000 + i] + [7] * PROMPT_TOKENS, [8], 0))
    store.finish_rollout("r-big", Outcome.SUCCESS, 1.0)
    store.close()
    return run_dir


def test_a_rollout_of_many_large_samples_gets_a_bounded_page(tmp_path: Path) -> None:
    with TestClient(create_dashboard_app(_many_samples(tmp_path), ADMIN_KEY)) as client:
        page = client.get("/ui/rollouts/r-big", headers=ADMIN).text
        shown = page.count('class="tok ')
        assert shown <= PAGE_TOKENS and len(page) < 100 * PAGE_TOKENS  # bytes: ~60 a token
        assert re.search(
            rf"token views of samples \d+\.\.{CALLS - 1} not shown: a page shows at most 40,000 tokens", page
        )
        # ... and names the reason of every call that broke a chain (each was found as its call was read).
        assert page.count('<span class="brk">break: new_context</span>') == CALLS - 1
        alone = client.get("/ui/rollouts/r-big", params={"sample": CALLS - 1}, headers=ADMIN).text
        assert (
            f'id="sample-{CALLS - 1}"' in alone
            and 'id="sample-0"' not in alone
            and f"Sample {CALLS - 1} alone" in alone
        )
        compare = client.get("/ui/compare", params={"a": "r-big", "b": "r-big"}, headers=ADMIN).text
        assert compare.count('class="tok ') <= PAGE_TOKENS  # half the budget on each side


def test_the_calls_table_lists_the_first_thousand_calls_and_counts_the_rest() -> None:
    rollout = Rollout(rollout_id="r", api_key="k")
    calls = [
        Call(rollout_id="r", seq=i, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.1])
        for i in range(1_005)
    ]
    rows = [CallRow.of(call) for call in calls]
    table = calls_table(rows, build_rollout_samples(rollout, calls[:1]), {})
    assert table.count("<tr><td class=num>") == 1_000 and "… 5 more calls not shown." in table


@pytest.mark.parametrize("rollout_id", ["a/b", "what?x=1", "tab#1", "100%", "two words"])
def test_a_rollout_id_of_any_characters_links_to_its_own_trace(tmp_path: Path, rollout_id: str) -> None:
    """Ids are put in links percent-encoded, as one path segment (regression: interpolated as they
    were, so ``a/b`` linked to a 404 and ``what?x=1`` to rollout ``what``)."""
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_rollout(rollout_id=rollout_id, task={"prompt": "p"})
    store.start_rollout(rollout_id)
    store.add_call(_call(rollout_id, [1, 2], [3], 0))
    store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    app = create_dashboard_app(tmp_path, ADMIN_KEY)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=ADMIN, timeout=30) as http:
        [link] = re.findall(r'class="trace-link" href="([^"]+)"', http.get("/ui/rollouts").text)
        trace = http.get(link.replace("&amp;", "&"))
        assert trace.status_code == 200, link
        heading = re.search(r"<h1>Rollout (.*?) <span", trace.text)
        assert heading is not None and heading.group(1) == html_escape(rollout_id)


def test_a_checkpoint_tokenizer_that_cannot_be_loaded_shows_token_ids_not_a_500(tmp_path: Path) -> None:
    # A run folder's checkpoints/final/tokenizer.json that does not load (cut short by a copy, a
    # full disk) made every trace and compare page a 500; docs/dashboard.md: without a tokenizer
    # the token view shows ids. A loadable one further down the list is used instead.
    run_dir = build_crafted(tmp_path)
    final = run_dir / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with TestClient(create_dashboard_app(run_dir, ADMIN_KEY)) as c:
        c.get(f"/ui/?key={ADMIN_KEY}")
        trace = c.get("/ui/rollouts/r-hack")
        assert trace.status_code == 200, trace.text[-2000:]
        assert "⟨4⟩" in trace.text  # the sampled token 4, shown as its id
        assert c.get("/ui/compare?a=r-hack&b=r-honest").status_code == 200
    # Control: with a loadable tokenizer in checkpoints/latest, tokens are decoded, not ids.
    latest = run_dir / "checkpoints" / "latest"
    latest.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        source = tiny_model_dir(weights=False) / name
        if source.is_file():
            (latest / name).write_bytes(source.read_bytes())
    with TestClient(create_dashboard_app(run_dir, ADMIN_KEY)) as c:
        c.get(f"/ui/?key={ADMIN_KEY}")
        trace = c.get("/ui/rollouts/r-hack")
        assert trace.status_code == 200 and "⟨4⟩" not in trace.text
