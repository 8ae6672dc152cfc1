"""``GatewayClient`` against a server at its address that is not a harnessrl gateway (a dashboard, a
proxy's HTML page): a 200 without JSON used to escape as ``json.JSONDecodeError`` (a traceback for the
trainer with ``trainer.gateway_url``; ``wait_ready`` gave up at once instead of waiting). It is an
``UpstreamError`` naming the address and the request now, which ``wait_ready`` waits through."""

from __future__ import annotations

import http.server
import json
import math
from collections.abc import Iterator

import pytest
from tests.fakes.http_server import served

from harnessrl.client import GatewayClient
from harnessrl.errors import BadRequest, ConfigError, UpstreamError


class Answers(http.server.BaseHTTPRequestHandler):
    """``/api/state`` answers JSON; every other path an HTML page, as a web server's index would."""

    def do_GET(self) -> None:
        is_json = self.path == "/api/state"
        body = json.dumps({"paused": False}).encode() if is_json else b"<html>a web page</html>"
        self.send_response(200)
        self.send_header("Content-Type", "application/json" if is_json else "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server_url() -> Iterator[str]:
    with served(Answers) as url:
        yield url


def test_a_200_without_json_is_an_upstream_error_naming_the_gateway(server_url):
    with GatewayClient(server_url, "key") as client:
        assert client.state() == {"paused": False}  # the control: JSON is read as before
        with pytest.raises(UpstreamError, match=r"GET /api/health answered 200 without JSON") as caught:
            client.health()
        assert server_url in str(caught.value) and "a web page" in str(caught.value)
        with pytest.raises(UpstreamError, match="not ready after"):
            client.wait_ready(timeout=0.5, interval=0.1)  # waited, then said why


@pytest.mark.parametrize("key", ["s3cret-admin\n", "s3cret-admin\r\nX-Injected: 1", "s3cret-admin\u00e9", ""])
def test_an_admin_key_no_header_can_carry_is_refused_without_showing_it(server_url, key):
    """A key read from a file with its newline: httpx refused the header and the ``UpstreamError``
    ("unreachable: Illegal header value b'Bearer s3cret-admin\\n'") printed the whole admin key into
    logs; a non-ASCII key was a ``UnicodeEncodeError`` traceback. A ``ConfigError`` that names the
    rule and not the key now."""
    with pytest.raises(ConfigError, match="admin key must be printable ASCII") as caught:
        GatewayClient(server_url, key).state()
    assert "s3cret" not in str(caught.value) and "s3cret" not in repr(caught.value)
    with GatewayClient(server_url, "s3cret-admin") as client:  # the control: a clean key works
        assert client.state() == {"paused": False}


def test_a_body_json_cannot_carry_is_a_bad_request_naming_it(server_url):
    """A NaN reward (the mean of no scores) or a NaN in a task escaped the client as json's bare
    ``ValueError`` ("Out of range float values are not JSON compliant"), naming neither the request
    nor the field; a ``BadRequest`` naming them now, and nothing is sent."""
    with GatewayClient(server_url, "key") as client:
        with pytest.raises(
            BadRequest, match=r"finish_rollout 'r-1': reward must be a finite number, got nan"
        ):
            client.finish_rollout("r-1", "success", math.nan)
        with pytest.raises(BadRequest, match=r"reward must be a finite number, got inf"):
            client.finish_rollout("r-1", "success", math.inf)
        with pytest.raises(BadRequest, match=r"POST /api/rollouts: the request cannot be sent as JSON"):
            client.create_rollout({"weight": math.nan})
        with pytest.raises(BadRequest, match=r"/finish: the request cannot be sent as JSON"):
            client.finish_rollout("r-1", "success", 1.0, metadata={"score": math.nan})
