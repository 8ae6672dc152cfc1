"""Every dashboard page on a store made by a real tiny training run, and on a crafted one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import RunFolder

from harnessrl.dashboard.data import DashboardData
from harnessrl.dashboard.logs import log_path, read_log_tail
from harnessrl.errors import NotFound
from harnessrl.schemas import Rollout


def _row_ids(html: str) -> list[str]:
    return re.findall(r'class="trace-link" href="/ui/rollouts/([^"]+)"', html)


def _rows(html: str) -> list[dict[str, str]]:
    """The table's rows as ``{column header: cell html}``."""
    head = re.search(r"<table id=rollouts><tr>(.*?)</tr>", html).group(1)  # type: ignore[union-attr]
    names = [re.sub(r"<[^>]+>|[ ↑↓]+$", "", th) for th in re.findall(r"<th[^>]*>(.*?)</th>", head)]
    return [
        dict(zip(names, re.findall(r"<td[^>]*>(.*?)</td>", row), strict=True))
        for row in re.findall(r'<tr class="rollout-row">(.*?)</tr>', html)
    ]


def test_runs_page_shows_run_status_config_and_charts(client: TestClient, tiny_run: RunFolder) -> None:
    html = client.get("/ui/").text
    assert tiny_run.run_id in html and "b-finished" in html
    assert "<details><summary>config</summary>" in html and "tiny-vowels" in html
    for title in ("Reward", "Samples per rollout", "Staleness", "Throughput", "Step time", "Pause time"):
        assert f'aria-label="{title}' in html
    assert html.count("<polyline") >= 5  # train reward, samples, staleness, tokens/s, step/pause time
    assert 'http-equiv="refresh"' not in html  # a finished run does not refresh


def test_rollouts_table_filters_and_pages(client: TestClient, tiny_run: RunFolder) -> None:
    html = client.get("/ui/rollouts").text
    ids = _row_ids(html)
    # 2 trained steps of 2 groups x 8, plus whole groups the async feeder had in flight.
    assert len(ids) >= 32 and len(ids) % 8 == 0 and "page 1 of 1" in html
    group = client.get("/ui/rollouts", params={"group": "g000000"}).text
    assert sorted(_row_ids(group)) == sorted(tiny_run.rollout_id(0, i) for i in range(8))
    assert "compare best vs worst" in group
    step0 = _row_ids(client.get("/ui/rollouts", params={"step": "0"}).text)
    assert step0 and all(rid in ids for rid in step0) and len(step0) < len(ids)
    assert _row_ids(client.get("/ui/rollouts", params={"outcome": "timeout"}).text) == []
    assert "no rollouts match" in client.get("/ui/rollouts", params={"flagged": "1"}).text
    # Newest first by default; oldest first, by reward, by split and by result on request.
    oldest_html = client.get("/ui/rollouts", params={"order": "oldest"}).text
    assert _row_ids(oldest_html) == ids[::-1]
    by_reward = _row_ids(
        client.get("/ui/rollouts", params={"order": "reward_desc", "run": "tiny-vowels"}).text
    )
    assert sorted(by_reward) == sorted(ids) and by_reward != ids
    heldout = _row_ids(client.get("/ui/rollouts", params={"split": "eval"}).text)
    train = _row_ids(client.get("/ui/rollouts", params={"split": "train"}).text)
    assert train and not set(train) & set(heldout) and len(train) + len(heldout) == len(ids)
    results = {
        r: set(_row_ids(client.get("/ui/rollouts", params={"result": r}).text))
        for r in ("solved", "partial", "unsolved")
    }
    assert results["partial"] and sum(map(len, results.values())) == len(set().union(*results.values()))
    assert set().union(*results.values()) <= set(ids)  # rewards in [0, 1]: each rollout in one class
    # columns: calls, sampled tokens, samples and policy versions come from the calls
    first = _rows(oldest_html)[0]
    assert first["calls"] == "1" and int(first["tokens"]) > 0 and first["samples"] == "1"
    assert (
        first["policy versions"] == "0"
        and first["split"] == "train"
        and first["group"].endswith("g000000</a>")
    )


def test_table_sorts_by_header_links_on_reward_duration_and_created(client: TestClient) -> None:
    def durations(order: str) -> list[float | None]:
        html = client.get("/ui/rollouts", params={"order": order}).text
        return [float(row["duration"].rstrip("s")) if row["duration"] else None for row in _rows(html)]

    longest, shortest = durations("duration_desc"), durations("duration_asc")
    timed = [d for d in longest if d is not None]
    assert len(timed) > 8 and longest[: len(timed)] == sorted(timed, reverse=True)  # unfinished: last
    assert shortest[: len(timed)] == sorted(timed)
    # A sortable header links to its order, and to the other way once sorted by it.
    default = client.get("/ui/rollouts").text
    assert 'data-order="reward_desc"' in default and 'data-order="duration_desc"' in default
    assert 'data-order="oldest"' in default  # newest first already: "created" sorts oldest first
    by_reward = client.get("/ui/rollouts", params={"order": "reward_desc"}).text
    assert 'data-order="reward_asc"' in by_reward and "reward</a> ↓" in by_reward
    rewards = [float(row["reward"]) for row in _rows(by_reward) if row["reward"]]
    assert len(rewards) > 8 and rewards == sorted(rewards, reverse=True)


def test_step_zero_survives_the_sort_and_pager_links(client: TestClient) -> None:
    # url() once dropped 0 as empty, so sorting the step-0 rows showed every step.
    html = client.get("/ui/rollouts", params={"step": "0"}).text
    assert "order=reward_desc&amp;step=0" in html or "step=0&amp;order=reward_desc" in html
    assert {row["step"] for row in _rows(html)} == {"0"}


def test_trace_shows_conversation_tokens_and_versions(client: TestClient, tiny_run: RunFolder) -> None:
    html = client.get(f"/ui/rollouts/{tiny_run.rollout_id(0, 0)}").text
    assert "reply with vowels only" in html  # the task prompt as the harness sent it
    assert 'class="msg assistant answer"' in html
    assert 'class="tok smp' in html and 'class="tok ctx"' in html
    assert re.search(r'title="#\d+ id \d+ · sampled · logprob -?\d+\.\d{4}"', html)
    assert "&lt;|im_start|&gt;" in html  # tokens decoded with the run's tokenizer, escaped
    assert 'class="pv">call 0 · v0' in html and "evaluator output" in html


def test_compare_shows_both_rollouts(client: TestClient, tiny_run: RunFolder) -> None:
    r0, r1, other_group = (tiny_run.rollout_id(g, k) for g, k in ((0, 0), (0, 1), (1, 0)))
    html = client.get("/ui/compare", params={"a": r0, "b": r1}).text
    assert html.count('class="side"') == 2 and r1 in html
    assert "not in the same group" not in html
    other = client.get("/ui/compare", params={"a": r0, "b": other_group}).text
    assert "not in the same group" in other
    assert client.get("/ui/compare", params={"a": r0}).status_code == 400


def test_unknown_rollout_is_404(client: TestClient) -> None:
    assert client.get("/ui/rollouts/nope").status_code == 404


def test_crafted_trace_highlights_audit_and_marks_breaks(crafted: TestClient) -> None:
    html = crafted.get("/ui/rollouts/r-hack").text
    assert 'cd x &amp;&amp; <mark class="hit">rm -rf tests/</mark> &amp;&amp; pytest' in html
    assert "chain break: new_context" in html and "break: new_context" in html
    assert 'class="pv">call 2 · v8' in html and 'class="pv">call 0 · v7' in html
    assert "<b>bash</b>" in html and "tests/ &lt;main.py&gt;" in html and "done!" in html
    assert "PASSED &lt;ok&gt;" in html
    assert "<script>" not in html and "t&lt;script&gt;" in html
    assert "api_key" not in html and "hrl-" not in html  # rollout keys never reach the page


def test_crafted_flagged_filter_and_heldout_chart(crafted: TestClient) -> None:
    assert _row_ids(crafted.get("/ui/rollouts", params={"flagged": "1"}).text) == ["r-hack"]
    table = crafted.get("/ui/rollouts").text
    assert '<option value="test_tampering">test_tampering</option>' in table  # the store's flags
    assert _row_ids(crafted.get("/ui/rollouts", params={"flag": "test_tampering"}).text) == ["r-hack"]
    assert _row_ids(crafted.get("/ui/rollouts", params={"flag": "no_such_rule"}).text) == []
    assert {r["split"] for r in _rows(table)} == {"train", "held-out"}
    assert _row_ids(crafted.get("/ui/rollouts", params={"outcome": "policy_failure"}).text) == ["r-honest"]
    runs = crafted.get("/ui/").text
    assert "held-out" in runs and "held-out (none)" not in runs


def test_result_badges_show_the_reward_not_the_harness_exit(crafted: TestClient) -> None:
    # "success" means the harness exited 0: a rollout that did so with reward 0 used to get a green
    # "success" badge. The result is the reward; how the harness ended is on hover and in the trace.
    table = crafted.get("/ui/rollouts").text
    assert '<span class="badge b-solved" title="harness: success">solved</span>' in table
    assert '<span class="badge b-unsolved" title="harness: policy_failure">unsolved</span>' in table
    assert "badge b-success" not in table
    trace = crafted.get("/ui/rollouts/r-honest").text
    assert '<h1>Rollout r-honest <span class="badge b-unsolved"' in trace
    assert 'harness ended</td><td><span class="badge b-policy_failure">policy_failure</span>' in trace


def test_every_logged_metric_is_charted_in_groups_with_smoothing_and_a_clock_axis(
    crafted: TestClient,
) -> None:
    page = crafted.get("/ui/").text
    assert '<h3 class="chart-group">Reward</h3>' in page and 'aria-label="Reward"' in page
    assert 'aria-label="Loss"' not in page  # nothing logged for it: no empty chart
    assert "Other metrics (1)" in page and 'aria-label="custom/x"' in page  # a metric no group names
    assert 'class="smoothed"' not in page and ">step</text>" in page
    smooth = crafted.get("/ui/", params={"smooth": "0.9", "x": "minutes"}).text
    assert 'class="smoothed"' in smooth and ">minutes</text>" in smooth
    assert "minutes 3: 0.3" in smooth  # step 3 was logged 3 minutes after step 1's row... minus step 1
    assert crafted.get("/ui/", params={"smooth": "junk", "x": "nope"}).status_code == 200


def test_live_refresh_while_running(crafted: TestClient, tmp_path) -> None:  # noqa: ANN001
    from harnessrl.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path / "crafted" / "harnessrl.db")
    store.set_run_status("crafted", "running")
    store.create_rollout(rollout_id="r-live", run_id="crafted", metadata={"kind": "train"})
    store.close()
    assert 'http-equiv="refresh"' in crafted.get("/ui/").text
    live = crafted.get("/ui/rollouts/r-live").text
    assert 'http-equiv="refresh"' in live and "trained at step</td><td>not trained (yet)" in live
    assert 'http-equiv="refresh"' not in crafted.get("/ui/rollouts/r-hack").text


def test_trace_shows_split_steps_advantage_and_log_links(crafted: TestClient) -> None:
    hack = crafted.get("/ui/rollouts/r-hack").text
    assert "split</td><td>train" in hack and "created at step</td><td>3" in hack
    assert "trained at step</td><td><b>4</b>" in hack and "advantage</td><td><b>0.5</b>" in hack
    assert "(training group 1)" in hack
    assert (
        'href="/ui/rollouts/r-hack/logs/0/stdout"' in hack
        and 'href="/ui/rollouts/r-hack/logs/0/stderr"' in hack
    )
    honest = crafted.get("/ui/rollouts/r-honest").text
    assert "taught nothing" in honest and "/logs/0/stdout" not in honest  # its stdout.log is a link out
    retried = crafted.get("/ui/rollouts/r-retried").text
    assert "evaluated at step</td><td>4" in retried and "held-out" in retried and "trained at" not in retried
    links = re.findall(r'class="log-link" href="/ui/rollouts/r-retried/logs/(\d)/(\w+)"', retried)
    assert links == [("0", "stderr"), ("1", "stdout"), ("1", "stderr")]  # one line per attempt
    assert "attempt 0:" in retried and "attempt 1:" in retried


def test_logs_are_plain_text_and_only_of_stored_attempts(crafted: TestClient) -> None:
    log = crafted.get("/ui/rollouts/r-hack/logs/0/stdout")
    assert log.status_code == 200 and log.text == "<script>alert(1)</script> hacked"
    assert (
        log.headers["content-type"].startswith("text/plain")
        and log.headers["x-content-type-options"] == "nosniff"
    )
    assert crafted.get("/ui/rollouts/r-retried/logs/1/stdout").text == "second attempt ok"
    for missing in ("r-retried/logs/0/stdout", "r-retried/logs/2/stderr", "nope/logs/0/stdout"):
        assert crafted.get(f"/ui/rollouts/{missing}").status_code == 404, missing


def test_logs_refuse_traversal_and_links_out(crafted: TestClient, tmp_path: Path) -> None:
    from harnessrl.store.sqlite import SQLiteStore

    run_dir = tmp_path / "crafted"
    # A stored rollout id that climbs out of RUN_DIR/rollouts, with a file where it would lead.
    store = SQLiteStore(run_dir / "harnessrl.db")
    store.create_rollout(rollout_id="..", run_id="crafted")
    store.close()
    (run_dir / "attempt-0").mkdir()
    (run_dir / "attempt-0" / "stdout.log").write_text("SECRET in the run folder")
    with pytest.raises(NotFound):
        log_path(run_dir, store_rollout(run_dir, ".."), 0, "stdout")
    for attempt in (
        "r-honest/logs/0/stdout",  # stdout.log is a symlink to a file outside the run folder
        "r-hack/logs/0/..%2F..%2F..%2Fharnessrl.db",
        "r-hack/logs/0/config",
        "r-hack/logs/-1/stdout",
        "..%2F..%2Fsecret.txt/logs/0/stdout",
        "%2E%2E/logs/0/stdout",
    ):
        response = crafted.get(f"/ui/rollouts/{attempt}")
        assert response.status_code == 404 and "SECRET" not in response.text, attempt


def store_rollout(run_dir: Path, rollout_id: str) -> Rollout:
    return DashboardData(run_dir / "harnessrl.db").get_rollout(rollout_id)


def test_a_long_log_is_served_as_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    path.write_text("a" * 2000 + "b" * 1000)
    text = read_log_tail(path, limit=1000)
    assert text == "[first 2000 of 3000 bytes not shown]\n" + "b" * 1000
    assert read_log_tail(path) == "a" * 2000 + "b" * 1000


def test_a_step_past_sqlites_integers_matches_no_rollout(crafted: TestClient) -> None:
    for step in (str(2**63), str(-(2**63) - 1), "9" * 400):
        page = crafted.get("/ui/rollouts", params={"step": step})
        assert page.status_code == 200 and "no rollouts match" in page.text
    assert _row_ids(crafted.get("/ui/rollouts", params={"step": str(2**63 - 1)}).text) == []
    assert _row_ids(crafted.get("/ui/rollouts", params={"step": "3"}).text)  # control: a stored step
