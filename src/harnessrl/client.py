"""``GatewayClient``: a small synchronous client for the gateway's control API (admin key).

What the controller and trainer use to create rollouts, read their calls, finish them with a
reward, and pause/resume the gateway around a weight update. Error responses are turned back into
the ``harnessrl.errors`` class of their status (404 -> ``NotFound``, 409 -> ``Conflict`` ...), so
callers handle the same exceptions as when talking to the store directly.
"""

from __future__ import annotations

import math
import numbers
import re
import time
from typing import Any
from urllib.parse import quote

import httpx

from harnessrl.errors import (
    BadRequest,
    ConfigError,
    Conflict,
    Forbidden,
    HarnessRLError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UpstreamError,
)
from harnessrl.schemas import Call, Outcome

_BY_STATUS: dict[int, type[HarnessRLError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: Overloaded,
}


def rollout_path(rollout_id: str, tail: str = "") -> str:
    """The control API path of one rollout: its id percent-encoded as one path segment. Rollout ids
    start with the run's name, which may hold ``#``, ``?``, ``%`` or a space; unencoded, ``#`` would
    cut the path (``GET /api/rollouts/exp`` for ``exp#2-g0-0``) and ``%41`` would arrive as ``A``."""
    return f"/api/rollouts/{quote(rollout_id, safe='')}{tail}"


def check_drained(answer: dict[str, Any], base_url: str) -> None:
    """Refuse a pause answer in which some gateway still had calls in flight (``drained: false``:
    the pause timed out before every live gateway acked it quiet). Updating weights then would cut
    those calls short or record them under the wrong policy. ``UpstreamError`` naming each such gateway."""
    if answer.get("drained", False) is True:  # the bool itself: "false" as a string is truthy
        return
    gateways = answer.get("gateways") or [{**answer, "url": base_url}]
    stuck = [
        f"{g.get('url') or g.get('gateway_id') or base_url} ({g.get('in_flight', '?')} in flight)"
        for g in gateways
        if isinstance(g, dict) and g.get("drained", False) is not True
    ]
    raise UpstreamError(
        "the gateway pause did not drain, so the weights were not updated: "
        + ", ".join(stuck or [base_url])
        + " (raise gateway.pause_timeout_s; a gateway that stopped heartbeating is waited for until "
        "its lease, gateway.lease_s, ends)"
    )


def _check_header_safe(admin_key: str) -> None:
    """Refuse an admin key an HTTP header cannot carry, without showing it: a key read from a file
    with its newline made httpx refuse the header and the error (``Illegal header value b'Bearer
    KEY\\n'``) printed the whole key, called the gateway "unreachable", and a non-ASCII key was a
    ``UnicodeEncodeError`` traceback. The gateway's own ``gateway.admin_key`` has the same rule."""
    if not re.fullmatch(r"[\x21-\x7e]+", admin_key):
        raise ConfigError(
            "GatewayClient: the admin key must be printable ASCII without spaces or newlines (it is "
            "sent in an HTTP header); strip the newline of a key read from a file"
        )


#: ``pause()``'s drain timeout when not told: ``GatewayConfig.pause_timeout_s``'s default.
DEFAULT_PAUSE_TIMEOUT_S = 300.0


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        admin_key: str,
        *,
        timeout: float = 60.0,
        pause_timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``timeout``: seconds an answer may take (for ``pause``, beyond the drain it waits for).
        ``pause_timeout_s``: how long ``pause()`` lets the gateways drain when not told."""
        _check_header_safe(admin_key)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.pause_timeout_s = pause_timeout_s
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {admin_key}"},
            timeout=timeout,
            transport=transport,
        )

    # -- plumbing -----------------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The gateway's answer to one request: ``UpstreamError`` if it cannot be reached, the
        ``harnessrl.errors`` class of its status for an error answer."""
        try:
            request = self._http.build_request(method, path, **kwargs)
        except (TypeError, ValueError) as exc:  # NaN, a numpy scalar: json.dumps refused the body
            raise BadRequest(f"{method} {path}: the request cannot be sent as JSON: {exc}") from exc
        try:
            response = self._http.send(request)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"gateway at {self.base_url} unreachable: {exc}") from exc
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:  # another server at this address (a dashboard, a proxy's HTML page)
            raise UpstreamError(
                f"gateway at {self.base_url}: {method} {path} answered {response.status_code} without "
                f"JSON (is it a harnessrl gateway?): {response.text[:200]!r}"
            ) from None

    @staticmethod
    def _error(response: httpx.Response) -> HarnessRLError:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        cls = _BY_STATUS.get(response.status_code)
        if cls is None:
            cls = UpstreamError if response.status_code >= 500 else HarnessRLError
        return cls(f"gateway: {message}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- health -------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/api/health")

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.1) -> dict[str, Any]:
        """Poll ``/api/health`` until it answers 200; ``UpstreamError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                return self.health()
            except HarnessRLError as exc:
                last = exc
            time.sleep(interval)
        raise UpstreamError(f"gateway at {self.base_url} not ready after {timeout}s: {last}")

    # -- rollouts -----------------------------------------------------------------------------------

    def create_rollout(
        self,
        task: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
        group: str | None = None,
        run_id: str | None = None,
        task_id: str | None = None,
        step: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create (or fetch, for an existing ``rollout_id``) a rollout: ``rollout_id``, ``api_key``, ``base_url``..."""
        body: dict[str, Any] = {"task": task or {}}
        for key, value in (
            ("rollout_id", rollout_id),
            ("group", group),
            ("run_id", run_id),
            ("task_id", task_id),
            ("step", step),
            ("metadata", metadata),
        ):
            if value is not None:
                body[key] = value
        return self._request("POST", "/api/rollouts", json=body)

    def get_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._request("GET", rollout_path(rollout_id))

    def list_rollouts(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v
            for k, v in {"status": status, "run_id": run_id, "limit": limit, "offset": offset}.items()
            if v is not None  # limit=0 or offset=0 is a value (the gateway answers it), not "unset"
        }
        return self._request("GET", "/api/rollouts", params=params)

    def list_calls(self, rollout_id: str, *, attempt: int | None = None) -> list[Call]:
        params = {"attempt": attempt} if attempt is not None else {}
        return [
            Call.model_validate(c)
            for c in self._request("GET", rollout_path(rollout_id, "/calls"), params=params)
        ]

    def finish_rollout(
        self,
        rollout_id: str,
        outcome: Outcome | str,
        reward: float,
        *,
        error: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(reward, numbers.Real) or not math.isfinite(reward):
            # NaN (the mean of no scores) escaped as json's ValueError, naming no field
            raise BadRequest(f"finish_rollout {rollout_id!r}: reward must be a finite number, got {reward!r}")
        body: dict[str, Any] = {"outcome": str(Outcome(outcome)), "reward": float(reward)}
        if error is not None:
            body["error"] = error
        if metadata is not None:
            body["metadata"] = metadata
        return self._request("POST", rollout_path(rollout_id, "/finish"), json=body)

    def cancel_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._request("POST", rollout_path(rollout_id, "/cancel"))

    # -- pause / resume -----------------------------------------------------------------------------

    # Any gateway takes these for every gateway sharing its store (docs/scale.md).

    def pause(self, timeout: float | None = None) -> dict[str, Any]:
        """Hold new model calls on every gateway of this gateway's gate (``gateway.gate``); returns
        once in-flight calls drained (``drained``) or after ``timeout`` (``None``: the client's
        ``pause_timeout_s``). ``Conflict`` if a resume overtook it (then do not update weights).

        The drain timeout is always sent, so the HTTP wait is bounded by it plus the client's
        ``timeout``: a gateway that accepted the request and stalled is an ``UpstreamError``, not a
        trainer waiting forever (with no timeout sent, the gateway used its own, which the client
        cannot know, and the request had none at all).
        """
        drain_s = self.pause_timeout_s if timeout is None else timeout
        return self._request(
            "POST", "/api/pause", params={"timeout": drain_s}, timeout=drain_s + self.timeout
        )

    def resume(self, *, policy_version: int | None = None, rewind: bool = False) -> dict[str, Any]:
        """Release held calls on every gateway of this gateway's gate. ``policy_version``: the
        trainer updated a shared remote engine itself; every gateway labels calls from now on with this version. ``rewind``: it is
        an older version than the gateways serve (a restored checkpoint), accept it anyway."""
        params: dict[str, Any] = {}
        if policy_version is not None:
            params["policy_version"] = policy_version
            if rewind:
                params["rewind"] = "true"
        return self._request("POST", "/api/resume", params=params)

    def state(self) -> dict[str, Any]:
        """The gate (paused, command, live policy version), totals and ``gateways`` (one per live process)."""
        return self._request("GET", "/api/state")

    def metrics(self) -> str:
        return self._send("GET", "/metrics").text
