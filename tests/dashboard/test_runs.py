"""Several run folders in one dashboard: found from a parent folder or repeated --run-dir, their
metrics overlaid at /ui/ (one colour per run), each run's own pages under /ui/runs/NAME/."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, REPO, make_run_folder

from harnessrl.dashboard import create_dashboard_app
from harnessrl.dashboard.charts import COLORS
from harnessrl.errors import ConfigError, NotFound
from harnessrl.gateway.server import serve_in_thread


def _metrics(scale: float) -> list[dict[str, float]]:
    return [
        {
            "step": s,
            "time": 100.0 + 60 * s,
            "reward/mean": scale * s,
            "heldout/reward": scale * s / 2,
            "lr": 0.1,
        }
        for s in (1, 2, 3)
    ]


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """``runs/`` holding two run folders and a folder that is no run."""
    make_run_folder(tmp_path / "runs" / "alpha", "alpha", _metrics(0.1))
    make_run_folder(tmp_path / "runs" / "beta", "beta", _metrics(0.2), status="running")
    (tmp_path / "runs" / "notes").mkdir()
    return tmp_path / "runs"


def _signed_in(app: object) -> TestClient:
    client = TestClient(app)  # type: ignore[arg-type]
    assert client.get(f"/ui/?key={ADMIN_KEY}").status_code == 200
    return client


def test_a_parent_folder_overlays_its_runs_one_colour_each(parent: Path) -> None:
    client = _signed_in(create_dashboard_app(parent, ADMIN_KEY))
    page = client.get("/ui/").text
    assert re.findall(r'<tr class="run-row" data-run="([^"]+)"', page) == ["alpha", "beta"]  # not "notes"
    assert f'background:{COLORS[0]}"></span><a href="/ui/runs/alpha/">alpha' in page  # the colour legend
    reward = re.search(r'aria-label="Reward".*?</svg>', page).group(0)  # type: ignore[union-attr]
    strokes = re.findall(
        r'<polyline points="[^"]+" fill="none" stroke="(#\w+)" stroke-width="2"( stroke-dash)?', reward
    )
    # Run i in colour i; each run's train reward solid, its held-out reward dashed.
    assert strokes == [
        (COLORS[0], ""),
        (COLORS[0], " stroke-dash"),
        (COLORS[1], ""),
        (COLORS[1], " stroke-dash"),
    ]
    assert ">held-out</text>" in reward and "<title>beta · train step 3: 0.6</title>" in reward
    assert 'http-equiv="refresh"' in page  # beta is running
    assert 'href="/ui/rollouts"' not in page  # the overview has no rollouts of its own
    smooth = client.get("/ui/", params={"smooth": "0.9", "x": "minutes"}).text
    assert smooth.count('class="smoothed"') >= 4 and ">minutes</text>" in smooth


def test_each_run_keeps_its_own_pages_under_its_name(parent: Path) -> None:
    client = _signed_in(create_dashboard_app(parent, ADMIN_KEY))
    table = client.get("/ui/runs/beta/rollouts").text
    assert 'href="/ui/runs/beta/rollouts/beta-r0"' in table and "alpha-r0" not in table
    assert '<a href="/ui/">All runs</a>' in table
    assert "beta-r0" in client.get("/ui/runs/beta/rollouts/beta-r0").text
    assert 'aria-label="Reward"' in client.get("/ui/runs/alpha/").text
    assert client.get("/ui/runs/alpha/rollouts/beta-r0").status_code == 404
    assert client.get("/ui/rollouts").status_code == 404


def test_the_overview_and_each_run_need_the_admin_key(parent: Path) -> None:
    anonymous = TestClient(create_dashboard_app(parent, ADMIN_KEY), follow_redirects=False)
    for route in ("/ui/", "/ui/runs/alpha/", "/ui/runs/alpha/rollouts", "/ui/runs/alpha/rollouts/alpha-r0"):
        assert anonymous.get(route).status_code == 401, route
        assert anonymous.get(route, headers={"Authorization": "Bearer wrong"}).status_code == 403, route
        assert anonymous.get(route, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200


def test_repeated_folders_get_unique_names_and_a_bad_path_is_named(tmp_path: Path) -> None:
    a = make_run_folder(tmp_path / "a" / "run", "one", _metrics(0.1))
    b = make_run_folder(tmp_path / "b" / "run", "two", _metrics(0.2))
    page = _signed_in(create_dashboard_app([a, b, a], ADMIN_KEY)).get("/ui/").text
    assert re.findall(r'data-run="([^"]+)"', page) == ["run", "run-2"]  # the repeat of a counted once
    with pytest.raises(NotFound, match="is '.*empty' a run folder"):
        create_dashboard_app([a, tmp_path / "empty"], ADMIN_KEY)


def test_cli_takes_run_dir_repeatedly(parent: Path) -> None:
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    cmd = [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(parent / "alpha"),
           "--run", str(parent / "beta"), "--port", "0"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        url = re.search(r"(http://\S+)/ui/", line).group(1)  # type: ignore[union-attr]
        page = httpx.get(f"{url}/ui/", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=30).text
        assert re.findall(r'data-run="([^"]+)"', page) == ["alpha", "beta"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_with_an_empty_admin_key_variable_prints_the_key_it_made(parent: Path) -> None:
    """Regression: with ``HARNESSRL_ADMIN_KEY=`` (set, empty) the CLI made a key but printed
    ``?key=$HARNESSRL_ADMIN_KEY``, which expands to nothing: nobody could sign in."""
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ""}
    cmd = [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(parent / "alpha"), "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        found = re.search(r"(http://\S+)/ui/\?key=(\S+)", line)
        assert found is not None, line
        url, key = found.groups()
        assert key != "$HARNESSRL_ADMIN_KEY"
        signed_in = httpx.get(f"{url}/ui/", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert signed_in.status_code == 200
        assert (
            httpx.get(f"{url}/ui/", headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 403
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_store_of_an_older_schema_is_refused_with_how_to_migrate(tmp_path: Path) -> None:
    folder = make_run_folder(tmp_path / "old", "old", _metrics(0.1))
    with sqlite3.connect(folder / "harnessrl.db") as conn:
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with pytest.raises(ConfigError, match="schema version 3.*SQLiteStore"):
        create_dashboard_app(folder, ADMIN_KEY)


def test_a_run_folder_moved_away_shows_as_missing_and_the_others_still_answer(parent: Path) -> None:
    """Regression: moving one run folder away made every page of the dashboard a 500, the overview
    included (``NotFound`` from the moved run's store, uncaught)."""
    app = create_dashboard_app(parent, ADMIN_KEY)
    (parent / "beta").rename(parent.parent / "beta-archived")
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, headers=admin, timeout=30) as http:
        overview = http.get("/ui/")
        assert overview.status_code == 200
        assert re.findall(r'data-run="([^"]+)"', overview.text) == ["alpha", "beta"]
        missing = re.search(r'<tr class="run-row run-missing" data-run="beta">.*?</tr>', overview.text)
        assert missing is not None and "missing" in missing.group(0) and "does not exist" in missing.group(0)
        for route in ("/ui/runs/beta/", "/ui/runs/beta/rollouts", "/ui/runs/beta/rollouts/beta-r0"):
            response = http.get(route)
            assert response.status_code == 404 and "is gone (was its run folder moved?)" in response.text, (
                route
            )
        for route in ("/ui/runs/alpha/", "/ui/runs/alpha/rollouts", "/ui/runs/alpha/rollouts/alpha-r0"):
            assert http.get(route).status_code == 200, route


def test_a_store_that_cannot_be_read_is_a_503_page(parent: Path) -> None:
    client = _signed_in(create_dashboard_app(parent, ADMIN_KEY))
    store = parent / "beta" / "harnessrl.db"
    for leftover in (parent / "beta").glob("harnessrl.db-*"):  # a WAL the writer left
        leftover.unlink()
    store.write_bytes(b"this is no SQLite database " * 200)
    response = client.get("/ui/runs/beta/rollouts")
    assert response.status_code == 503 and "cannot be read" in response.text
    overview = client.get("/ui/")
    assert overview.status_code == 200 and 'class="run-row run-missing" data-run="beta"' in overview.text
    assert client.get("/ui/runs/alpha/rollouts").status_code == 200


def test_a_store_file_that_is_not_sqlite_is_a_config_error(tmp_path: Path) -> None:
    """Regression: ``sqlite3.DatabaseError`` escaped ``create_dashboard_app``, and the CLI printed a
    traceback and exited 1 instead of a message and 2."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "harnessrl.db").write_bytes(b"this is no SQLite database " * 200)
    with pytest.raises(ConfigError, match="is not a readable harnessrl store: file is not a database"):
        create_dashboard_app(folder, ADMIN_KEY)
    env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY}
    cmd = [sys.executable, "-m", "harnessrl", "dashboard", "--run-dir", str(folder), "--port", "0"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not a readable harnessrl store" in proc.stderr
    assert "Traceback" not in proc.stderr
