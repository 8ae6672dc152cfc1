"""What a policy, a damaged store or an odd config did to the dashboard, through the real app over a
real SQLite store (and the real CLI): an audit of thousands of long flagged commands made a 40 MB
trace page, an ``audit`` that is no list a 500, a rollout row that is no rollout failed the whole
compare with a 503, a stored attempt of 10**12 hung the trace page, a run config whose ``run`` is no
object failed the runs page, a damaged ``schema_version`` was a traceback, a zero-variance group's
"compare best vs worst" compared a rollout with itself, and no page said that scripts may not run."""

from __future__ import annotations

import html
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.data import DashboardData
from harnessrl.errors import ConfigError
from harnessrl.schemas import Call, Outcome
from harnessrl.store.sqlite import SQLiteStore

KEY = "dash-hunt-key"
REPO = Path(__file__).resolve().parents[2]
#: What a test waits for a page before calling it hung (only ever reached by a hung page).
HUNG_S = 120


def _call(rollout_id: str, prompt: list[int], sampled: list[int]) -> Call:
    return Call(
        rollout_id=rollout_id,
        prompt_token_ids=prompt,
        response_token_ids=sampled,
        response_logprobs=[-0.5] * len(sampled),
        policy_version=1,
        request={"messages": [{"role": "user", "content": f"prompt of {rollout_id}"}]},
    )


def _run_folder(tmp_path: Path, rollouts: dict[str, dict[str, object]], *, reward: float = 1.0) -> Path:
    """A run folder whose store holds one finished rollout, with one call, per ``rollouts`` entry
    (id -> the metadata it finished with), all in group ``g``."""
    run = tmp_path / "run"
    store = SQLiteStore(run / "harnessrl.db")
    store.create_run("run", {"run": {"name": "run"}})
    for rollout_id, metadata in rollouts.items():
        store.create_rollout(
            rollout_id=rollout_id, run_id="run", group_id="g", step=1, metadata={"kind": "train"}
        )
        store.start_rollout(rollout_id)
        store.add_call(_call(rollout_id, [1, 2, 3], [4, 5]))
        store.finish_rollout(rollout_id, Outcome.SUCCESS, reward, metadata=metadata)
    store.close()
    return run


def _signed_in(run: Path) -> TestClient:
    client = TestClient(create_dashboard_app(run, KEY), raise_server_exceptions=False)
    assert client.get(f"/ui/?key={KEY}").status_code == 200
    return client


def test_an_audit_of_many_long_commands_gets_a_bounded_trace_and_compare(tmp_path: Path) -> None:
    # A policy ran 2,000 flagged commands of 20,000 characters; the audit stores each one whole.
    padding = "x" * 10_000
    audit = [
        {
            "rule": "git_history",
            "call_seq": i,
            "command": f"{padding} git log -p {padding}",
            "match": "git log",
        }
        for i in range(2_000)
    ]
    run = _run_folder(tmp_path, {"flagged": {"audit": audit}, "plain": {}})
    with _signed_in(run) as client:
        trace = client.get("/ui/rollouts/flagged")
        compare = client.get("/ui/compare?a=flagged&b=plain")
    assert trace.status_code == 200 and compare.status_code == 200
    for page in (trace.text, compare.text):
        # 200 entries of at most 2,000 characters each, not 2,000 of 20,000 (a 40 MB page).
        assert len(page) < 2_000_000, len(page)
        assert '<mark class="hit">git log</mark>' in page  # the match is inside what is shown
        assert "1,800 more audit entries not shown" in page
        assert "characters not shown" in page
    assert trace.text.count('<div class="card flag">') == 200


def test_an_audit_that_is_no_list_is_shown_not_a_500(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"odd": {"audit": 12345}, "plain": {}})
    with _signed_in(run) as client:
        trace = client.get("/ui/rollouts/odd")
        compare = client.get("/ui/compare?a=odd&b=plain")
    assert trace.status_code == 200 and compare.status_code == 200
    assert "12345" in trace.text and "12345" in compare.text


@pytest.mark.parametrize(("column", "value"), [("status", "bogus"), ("attempt", "not a number")])
def test_a_compare_beside_a_rollout_row_that_is_no_rollout_shows_the_other(
    tmp_path: Path, column: str, value: str
) -> None:
    run = _run_folder(tmp_path, {"broken": {}, "fine": {"evaluation": {"stdout": "fine-evaluation"}}})
    with sqlite3.connect(run / "harnessrl.db") as conn:
        conn.execute(f"UPDATE rollouts SET {column} = ? WHERE rollout_id = 'broken'", (value,))
    with _signed_in(run) as client:
        for query in ("a=broken&b=fine", "a=fine&b=broken"):
            page = client.get(f"/ui/compare?{query}")
            assert page.status_code == 200, page.text[-500:]
            text = html.unescape(page.text)
            assert "fine-evaluation" in text  # the readable side, whole
            assert "Damaged record" in text and column in text  # the other, named
            assert "prompt of broken" in text  # its calls still read: their conversation is shown
        both = client.get("/ui/compare?a=broken&b=broken")
        assert both.status_code == 200 and html.unescape(both.text).count("Damaged record") == 2
        # Its own trace is still a 503 naming the damage (there is no rollout to show).
        assert client.get("/ui/rollouts/broken").status_code == 503


def test_a_stored_attempt_of_10_to_the_12_does_not_hang_the_trace(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"retried": {}})
    logs = run / "rollouts" / "retried" / "attempt-0"
    logs.mkdir(parents=True)
    (logs / "stdout.log").write_text("first attempt")
    with sqlite3.connect(run / "harnessrl.db") as conn:  # a damaged row, or a writer gone wrong
        conn.execute("UPDATE rollouts SET attempt = ? WHERE rollout_id = 'retried'", (10**12,))
    # The real CLI's server, in a process of its own: a page that hangs (it looped over every
    # attempt number) fails the test at the read timeout, and the server is killed after.
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(run), "--port", "0"],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HARNESSRL_ADMIN_KEY": KEY},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "dashboard: http://127.0.0.1:PORT/ui/?key=...": listening
        found = re.search(r"http://127\.0\.0\.1:(\d+)/ui/", line)
        assert found is not None, line
        base = f"http://127.0.0.1:{found.group(1)}/ui"
        with httpx.Client(headers={"x-api-key": KEY}, timeout=HUNG_S) as http:
            page = http.get(f"{base}/rollouts/retried")
            assert page.status_code == 200
            assert "/rollouts/retried/logs/0/stdout" in page.text  # the log there is still linked
            assert http.get(f"{base}/rollouts/retried/logs/0/stdout").text == "first attempt"
    finally:
        proc.kill()
        proc.wait(timeout=HUNG_S)
        if proc.stderr is not None:
            proc.stderr.close()


def test_a_run_config_whose_run_is_no_object_never_fails_the_runs_page(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"r": {}})
    store = SQLiteStore(run / "harnessrl.db")  # a gateway's store holds the runs of whoever made them
    store.create_run("odd", {"run": "not an object"})
    store.close()
    with _signed_in(run) as client:
        page = client.get("/ui/")
    assert page.status_code == 200
    assert "not an object" in page.text and 'id="run-odd"' in page.text


def test_a_damaged_schema_version_is_a_named_error_exit_2(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"r": {}})
    with sqlite3.connect(run / "harnessrl.db") as conn:
        conn.execute("UPDATE meta SET value = 'garbage' WHERE key = 'schema_version'")
    with pytest.raises(ConfigError, match="schema_version"):
        DashboardData(run / "harnessrl.db")
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": KEY}
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(run), "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HUNG_S,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "schema_version" in proc.stderr and "Traceback" not in proc.stderr


def test_a_zero_variance_groups_compare_link_names_two_rollouts(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"a": {}, "b": {}, "c": {}}, reward=0.0)
    store = SQLiteStore(run / "harnessrl.db")  # a running group-mate: no reward, neither best nor worst
    store.create_rollout(rollout_id="running", run_id="run", group_id="g", step=1)
    store.start_rollout("running")
    store.close()
    with _signed_in(run) as client:
        page = client.get("/ui/rollouts?group=g").text
    found = re.search(r'href="([^"]*/compare\?[^"]*)"', page)
    assert found is not None
    query = dict(pair.split("=") for pair in html.unescape(found.group(1)).split("?")[1].split("&"))
    assert query["a"] != query["b"] and {query["a"], query["b"]} <= {"a", "b", "c"}


def test_every_html_page_forbids_scripts_and_framing(tmp_path: Path) -> None:
    run = _run_folder(tmp_path, {"r": {}, "s": {}})
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    with _signed_in(run) as client:
        pages = {
            path: client.get(path)
            for path in ("/ui/", "/ui/rollouts", "/ui/rollouts/r", "/ui/compare?a=r&b=s", "/ui/rollouts/nope")
        }
    with TestClient(create_dashboard_app(run, KEY)) as anonymous:
        pages["401"] = anonymous.get("/ui/rollouts")
        pages["login"] = anonymous.get("/ui/login")
        pages["403"] = anonymous.get("/ui/", headers={"x-api-key": "wrong"})
    # Several runs: the overview page and a run's pages under it.
    other = _run_folder(tmp_path / "other", {"o": {}})
    with TestClient(create_dashboard_app([run, other], KEY)) as several:
        several.get(f"/ui/?key={KEY}")
        pages["overview"] = several.get("/ui/")
        pages["run under overview"] = several.get("/ui/runs/run/rollouts")
    for name, response in pages.items():
        assert response.headers["content-type"].startswith("text/html"), name
        policy = response.headers.get("content-security-policy", "")
        directives = dict(
            (part.strip().split(" ", 1) + [""])[:2] for part in policy.split(";") if part.strip()
        )
        assert directives.get("default-src") == "'none'" and "script-src" not in directives, (name, policy)
        assert directives.get("frame-ancestors") == "'none'", (name, policy)
        assert response.headers.get("x-content-type-options") == "nosniff", name


@pytest.mark.parametrize(
    ("column", "value"),
    [("policy_version", "abc"), ("policy_version", 1.5), ("prompt_len", "x"), ("seq", "z")],
)
def test_a_call_row_damaged_in_a_counted_column_never_fails_the_table(
    tmp_path: Path, column: str, value: object
) -> None:
    run = tmp_path / "run"
    store = SQLiteStore(run / "harnessrl.db")
    store.create_run("run", {"trainer": {"max_sample_tokens": 100}})
    for rollout_id in ("bad", "good"):
        store.create_rollout(rollout_id=rollout_id, run_id="run", group_id="g", step=0)
        store.start_rollout(rollout_id)
        store.add_call(_call(rollout_id, [1, 2, 3], [4, 5]))
        store.add_call(_call(rollout_id, [1, 2, 3, 4, 5, 6], [7]))
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    with sqlite3.connect(run / "harnessrl.db") as conn:  # one column of the bad rollout's last call
        conn.execute(f"UPDATE calls SET {column} = ? WHERE rollout_id = 'bad' AND seq = 1", (value,))
    with _signed_in(run) as client:
        page = client.get("/ui/rollouts")
    assert page.status_code == 200, page.text[-500:]
    rows = {
        found.group(1): found.group(0)
        for found in re.finditer(r'<tr class="rollout-row">.*?/rollouts/(\w+)".*?</tr>', page.text)
    }
    assert set(rows) == {"bad", "good"}  # the damaged rollout is listed like any other
    cells = re.findall(r"<td class=num[^>]*>([^<]*)</td>", rows["good"])
    # step, reward, duration, created, calls, tokens, samples: the good one's numbers are its own.
    assert cells[4:7] == ["2", "3", "1"], cells


def test_a_token_id_the_tokenizer_cannot_decode_is_shown_as_its_id(tmp_path: Path) -> None:
    # The run's own tokenizer (the tiny model's, as a run folder of examples/tiny names it); a
    # damaged call row's negative id made the library raise OverflowError: a 500 for the trace.
    run = tmp_path / "run"
    store = SQLiteStore(run / "harnessrl.db")
    store.create_run("run")
    for rollout_id, prompt in (("damaged", [5, -1, 6]), ("fine", [5, 6, 7])):
        store.create_rollout(rollout_id=rollout_id, run_id="run", step=0)
        store.start_rollout(rollout_id)
        store.add_call(_call(rollout_id, prompt, [8, 9]))
        store.finish_rollout(rollout_id, Outcome.SUCCESS, 1.0)
    store.close()
    (run / "config.json").write_text(json.dumps({"engine": {"model": "tiny"}}))
    with _signed_in(run) as client:
        fine, damaged = client.get("/ui/rollouts/fine"), client.get("/ui/rollouts/damaged")
    assert fine.status_code == 200 and 'title="#0 id 5 · context">#</span>' in fine.text  # decoded
    assert damaged.status_code == 200, damaged.text[-300:]
    assert 'title="#0 id 5 · context">#</span>' in damaged.text
    assert 'title="#1 id -1 · context">⟨-1⟩</span>' in damaged.text
