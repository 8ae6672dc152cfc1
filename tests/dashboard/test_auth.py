"""Only the admin key opens the dashboard: no key → 401, a rollout's key (or any other) → 403,
on every route, standalone and mounted in the gateway."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from tests.dashboard.conftest import ADMIN_KEY, RunFolder, build_crafted

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.dashboard import create_dashboard_app, gateway_dashboard
from harnessrl.dashboard.auth import MAX_LOGIN_BYTES, cookie_name
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

FORM = "application/x-www-form-urlencoded"
#: ``{r0}``, ``{r1}``: the first two rollouts of the tiny run's first group.
ROUTES = [
    "/ui/",
    "/ui/rollouts",
    "/ui/rollouts/{r0}",
    "/ui/rollouts/{r0}/logs/0/stderr",
    "/ui/compare?a={r0}&b={r1}",
]


@pytest.fixture(scope="module")
def rollout_key(tiny_run: RunFolder) -> str:
    with sqlite3.connect(tiny_run.path / "harnessrl.db") as conn:
        return conn.execute("SELECT api_key FROM rollouts LIMIT 1").fetchone()[0]


@pytest.fixture
def anonymous(tiny_run: RunFolder) -> TestClient:
    return TestClient(create_dashboard_app(tiny_run.path, ADMIN_KEY), follow_redirects=False)


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_refuses_no_key_and_rollout_keys(
    anonymous: TestClient, rollout_key: str, route: str, tiny_run: RunFolder
) -> None:
    route = route.format(r0=tiny_run.rollout_id(0, 0), r1=tiny_run.rollout_id(0, 1))
    response = anonymous.get(route)
    assert response.status_code == 401 and 'name="key"' in response.text  # the login form
    assert anonymous.get(route, headers={"Authorization": f"Bearer {rollout_key}"}).status_code == 403
    assert anonymous.get(route, headers={"x-api-key": rollout_key}).status_code == 403
    sep = "&" if "?" in route else "?"
    assert anonymous.get(f"{route}{sep}key={rollout_key}").status_code == 403
    assert "g000000" not in anonymous.get(f"{route}{sep}key={rollout_key}").text
    anonymous.cookies.set(cookie_name(ADMIN_KEY), rollout_key)
    assert anonymous.get(route).status_code == 403
    anonymous.cookies.clear()
    # Another dashboard's cookie (another name) is no cookie here: sign in, not "not valid".
    anonymous.cookies.set(cookie_name("another-dashboard-key"), rollout_key)
    assert anonymous.get(route).status_code == 401
    anonymous.cookies.clear()
    assert anonymous.get(route, headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200


def test_key_in_url_sets_httponly_cookie_and_drops_key(anonymous: TestClient) -> None:
    response = anonymous.get(f"/ui/rollouts?step=0&key={ADMIN_KEY}")
    assert response.status_code == 303 and response.headers["location"] == "/ui/rollouts?step=0"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert ADMIN_KEY not in cookie  # an HMAC of the key, not the key
    assert anonymous.get("/ui/rollouts?step=0").status_code == 200


def test_two_dashboards_on_one_host_keep_their_own_sign_in(tmp_path: Path) -> None:
    """Cookies ignore ports: one browser signed in to two dashboards on 127.0.0.1 holds both
    cookies, so each must have its own name (regression: one fixed name, and signing in to the
    second dashboard signed the browser out of the first, 403 "session is not valid")."""
    first = create_dashboard_app(build_crafted(tmp_path / "a"), ADMIN_KEY)
    second = create_dashboard_app(build_crafted(tmp_path / "b"), "the-other-dashboard-key")
    with serve_in_thread(first) as url_a, serve_in_thread(second) as url_b, httpx.Client() as browser:
        assert browser.get(f"{url_a}/ui/?key={ADMIN_KEY}", follow_redirects=True).status_code == 200
        signed_in = browser.get(f"{url_b}/ui/?key=the-other-dashboard-key", follow_redirects=True)
        assert signed_in.status_code == 200
        assert browser.get(f"{url_a}/ui/rollouts").status_code == 200  # still signed in to the first
        assert browser.get(f"{url_b}/ui/rollouts").status_code == 200
        assert len(browser.cookies.jar) == 2  # one jar, both cookies: one per dashboard
    assert cookie_name(ADMIN_KEY).startswith("harnessrl_dashboard_") and len(cookie_name(ADMIN_KEY)) == 28


def test_login_form(anonymous: TestClient, rollout_key: str) -> None:
    assert anonymous.get("/ui/login").status_code == 200
    bad = anonymous.post("/ui/login", data={"key": rollout_key, "next": "/ui/rollouts"})
    assert bad.status_code == 403 and "harnessrl_dashboard" not in bad.headers.get("set-cookie", "")
    good = anonymous.post("/ui/login", data={"key": ADMIN_KEY, "next": "https://evil.example/"})
    assert good.status_code == 303 and good.headers["location"] == "/ui/"  # no open redirect
    assert anonymous.get("/ui/rollouts").status_code == 200


def test_gateway_mounts_dashboard_behind_admin_key(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "harnessrl.db")
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    engine = ScriptedEngine(["Hello!"], tokenizer)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine, extra_routes=[gateway_dashboard])
    with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY) as client:
        rollout = client.create_rollout({"prompt": "test"})
        _check_gateway(url, rollout)
    store.close()


def _check_gateway(url: str, rollout: dict[str, Any]) -> None:
    with httpx.Client(base_url=url, follow_redirects=False) as http:
        assert http.get("/ui/").status_code == 401
        for route in ("/ui/", "/ui/rollouts", f"/ui/rollouts/{rollout['rollout_id']}"):
            assert (
                http.get(route, headers={"Authorization": f"Bearer {rollout['api_key']}"}).status_code == 403
            )
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        page = http.get(f"/ui/rollouts/{rollout['rollout_id']}", headers=admin)
        assert page.status_code == 200 and rollout["rollout_id"] in page.text
        assert rollout["rollout_id"] in http.get("/ui/rollouts", headers=admin).text


def test_a_sign_in_body_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    anonymous = TestClient(create_dashboard_app(build_crafted(tmp_path), ADMIN_KEY), follow_redirects=False)
    big = b"key=" + b"k" * MAX_LOGIN_BYTES + b"&next=/ui/rollouts"
    declared = anonymous.post("/ui/login", content=big, headers={"content-type": FORM})
    assert declared.status_code == 413 and "too large" in declared.text
    streamed = anonymous.post(
        "/ui/login", content=iter([big[:1000], big[1000:]]), headers={"content-type": FORM}
    )
    assert "content-length" not in streamed.request.headers  # chunked: counted while it is read
    assert streamed.status_code == 413 and "harnessrl_dashboard" not in streamed.headers.get("set-cookie", "")
    good = anonymous.post(
        "/ui/login", content=f"key={ADMIN_KEY}&next=/ui/rollouts".encode(), headers={"content-type": FORM}
    )
    assert good.status_code == 303 and good.headers["location"] == "/ui/rollouts"  # control: a real form
