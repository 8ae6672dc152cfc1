"""A trace page reads a rollout's calls one at a time: what it holds grows with what it shows (the
samples, each chain's tokens once), not with the number of calls times their prompts. Decoded all at
once, a rollout of 1,000 calls of 40 k tokens took 2 GB for one page (by hand: 32 MB now). Here the
same is checked at a small size by how the page's peak allocations scale with the number of calls,
and the samples, chains and breaks it shows are checked against the trainer's own build."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, _call

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.token_view import TokenViews, samples_html
from harnessrl.dashboard.trace_calls import read_trace_calls
from harnessrl.schemas import Call, Outcome, Rollout
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trajectory import build_rollout_samples

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CONTEXT = 3_000  # tokens of every rollout's first prompt
FINAL = 4_000  # about the tokens of every rollout's last call


def _one_chain(store: SQLiteStore, rollout_id: str, calls: int) -> None:
    """A rollout of ``calls`` calls on one chain, growing from ``CONTEXT`` to about ``FINAL`` tokens."""
    store.create_rollout(rollout_id=rollout_id, run_id="run", metadata={"kind": "train"})
    store.start_rollout(rollout_id)
    prompt = [1000 + i % 500 for i in range(CONTEXT)]
    step = (FINAL - CONTEXT) // calls
    for i in range(calls):
        answer = [2000 + i % 100]
        store.add_call(
            _call(rollout_id, prompt, answer, 0, request={"messages": [{"role": "user", "content": "go"}]})
        )
        prompt = prompt + answer + [3000 + (i + k) % 100 for k in range(step - 1)]
    store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)


def _peak_bytes(client: TestClient, rollout_id: str) -> int:
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    response = client.get(f"/ui/rollouts/{rollout_id}", headers=ADMIN)
    _, peak = tracemalloc.get_traced_memory()
    assert response.status_code == 200 and f"Rollout {rollout_id}" in response.text
    return peak - start


def test_a_trace_holds_what_it_shows_not_every_prompt_of_its_calls(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_run("run", {"run": {"name": "run"}})
    _one_chain(store, "r-few", 10)
    _one_chain(store, "r-many", 200)  # 20 times the calls, the same final context
    store.close()
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY)) as client:
        client.get(f"/ui/rollouts/r-few?key={ADMIN_KEY}")  # warm: imports, caches, the sign-in
        tracemalloc.start()
        try:
            few, many = _peak_bytes(client, "r-few"), _peak_bytes(client, "r-many")
        finally:
            tracemalloc.stop()
    # Holding every call's prompt at once, r-many peaked ~15 times as high as r-few (26 MB).
    assert many < 3 * few, (few, many)


def _again(prompt: list[int], sampled: list[int], version: int) -> Call:
    return _call("r", prompt, sampled, version, attempt=1)


def _interleaved(path: Path) -> None:
    """An agent, a subagent interleaved with it, a retried request, a diverging history and a call of
    an earlier (infra-failed) attempt: bases that are not each call's previous one."""
    store = SQLiteStore(path)
    store.create_rollout(rollout_id="r", metadata={"kind": "train"})
    store.start_rollout("r")
    store.add_call(_call("r", [9, 9, 9], [5], 0))  # attempt 0, abandoned
    store.requeue_rollout("r", error="runner lost")
    store.start_rollout("r")
    main, sub = [1, 2, 3], [50, 51]
    for i in range(6):
        store.add_call(_again(main, [10 + i], 0))
        main = main + [10 + i, 20 + i]
        store.add_call(_again(sub, [60 + i, 61], 1))
        sub = sub + [60 + i, 61, 70]
        if i == 2:
            store.add_call(_again(main[:-2], [99], 1))  # the same request again: retried
    store.add_call(_again([1, 2, 3, 10, 77], [88], 1))  # diverges right after the first answer
    store.add_call(_again(main, [42], 1))  # the main agent goes on
    store.finish_rollout("r", Outcome.SUCCESS, 1.0)
    store.close()


def test_the_trace_shows_the_samples_and_breaks_the_trainer_builds(tmp_path: Path) -> None:
    _interleaved(tmp_path / "harnessrl.db")
    data = DashboardData(tmp_path / "harnessrl.db")
    rollout: Rollout = data.get_rollout("r")
    built = build_rollout_samples(rollout, data.list_calls("r"))
    assert len(built.samples) == 4 and set(built.breaks) == {"new_context", "retried", "prefix_mismatch"}
    expected = {span.call_seq: f"sample {s.sample_index}" for s in built.samples for span in s.spans}
    with TestClient(create_dashboard_app(tmp_path, ADMIN_KEY)) as client:
        page = client.get(f"/ui/rollouts/r?key={ADMIN_KEY}").text
    # (seq, attempt, which sample, break reason) of each row of the calls table
    row = r"<tr><td class=num>(\d+)</td><td class=num>(\d+)</td>(?:(?!</tr>).)*?<td>([^<]*?) ?"
    rows = re.findall(row + r'(?:<span class="brk">break: (\w+)</span>)?</td></tr>', page)
    shown = {int(seq): where for seq, attempt, where, _ in rows if attempt == "1"}
    assert shown == {seq: expected.get(seq, "not in a sample") for seq in shown} and len(shown) == 15
    breaks = [reason for *_, reason in rows if reason]
    assert sorted(breaks) == sorted(built.breaks.elements())
    assert (
        f"{len(built.samples)} samples · breaks:" in page and "calls of earlier attempts ignored: 1" in page
    )
    assert page.count('title="#') == sum(len(s) for s in built.samples)  # every token of every sample


def test_samples_of_many_chains_stop_at_the_page_budget_and_say_so(tmp_path: Path) -> None:
    """Every call a chain of its own: the samples would hold every prompt (12 M tokens, 800 MB for
    300 calls of 40 k). They stop at ``max_tokens``; the page says so and marks the calls left out."""
    store = SQLiteStore(tmp_path / "harnessrl.db")
    store.create_rollout(rollout_id="r", metadata={"kind": "train"})
    store.start_rollout("r")
    for i in range(12):
        store.add_call(_call("r", [5000 + i] + [7] * 999, [8], 0))  # 1,001 tokens each
    store.finish_rollout("r", Outcome.SUCCESS, 1.0)
    store.close()
    data = DashboardData(tmp_path / "harnessrl.db")
    rollout = data.get_rollout("r")
    calls = read_trace_calls(data, "r", rollout, max_tokens=4_000)
    assert calls.built_from == 4 and calls.to_build == 12 and len(calls.built.samples) == 4
    assert calls.unbuilt == set(range(4, 12)) and calls.total == len(calls.rows) == 12
    assert calls.last is not None and calls.last.seq == 11  # the conversation is still the last call's
    table, tokens = samples_html(rollout, calls, str, TokenViews(trace_url="/ui/rollouts/r"))
    assert "cut short</span> built from the first 4 of 12 calls" in tokens
    assert table.count("not read for samples") == 8 and table.count("sample 3") == 1
    whole = read_trace_calls(data, "r", rollout)  # control: under the budget, all of them
    assert whole.built_from is None and len(whole.built.samples) == 12 and not whole.unbuilt
