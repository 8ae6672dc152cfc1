"""Who is calling: the admin (control API) or one rollout (model API).

Keys travel in ``Authorization: Bearer KEY`` (OpenAI SDKs) or ``x-api-key: KEY`` (Anthropic SDKs
and some harnesses). The admin key opens the control API only; a rollout key opens the model API
only, and only for its own rollout — a rollout must never be able to read or steer another one.
"""

from __future__ import annotations

import functools
import hmac

from starlette.requests import Request

from harnessrl.errors import Forbidden, InvalidTransition, NotFound, Unauthorized
from harnessrl.gateway.errors import RolloutClosed
from harnessrl.gateway.state import GatewayState
from harnessrl.schemas import TERMINAL_STATUSES, Rollout, RolloutStatus
from harnessrl.store.damage import RolloutUnreadable

#: What HTTP strips around a header's token (RFC 9110's optional whitespace). ``str.strip()`` would
#: also strip latin-1's non-breaking space and friends, so ``KEY\xa0`` would pass as ``KEY`` here and
#: count as another key in the per-key limit.
_OWS = b" \t"


def header_key(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The API key of a request's raw (ASGI) headers: the token of the first ``Authorization``
    header if it is ``Bearer TOKEN``, else the first ``x-api-key``. The one reading of a key: the
    per-key limit (``key_limits``) counts exactly the key this authenticates, whatever duplicate
    headers or padding a harness sends."""
    authorization = api_key = None
    for name, value in headers:
        if name == b"authorization":
            if authorization is None:
                authorization = value
        elif name == b"x-api-key" and api_key is None:
            api_key = value
    if authorization is not None:
        scheme, _, token = authorization.partition(b" ")
        token = token.strip(_OWS)
        if scheme.lower() == b"bearer" and token:
            return token
    if api_key is not None:
        return api_key.strip(_OWS) or None
    return None


def request_key(request: Request) -> str | None:
    key = header_key(request.scope["headers"])
    return key.decode("latin-1") if key is not None else None


def _is_admin(state: GatewayState, key: str | None) -> bool:
    admin = state.config.admin_key
    return bool(key and admin and hmac.compare_digest(key.encode(), admin.encode()))


def is_admin_request(request: Request, state: GatewayState) -> bool:
    """Whether the request carries the admin key (for an open route that tells the admin more)."""
    return _is_admin(state, request_key(request))


def require_admin(request: Request, state: GatewayState) -> None:
    key = request_key(request)
    if key is None:
        raise Unauthorized("missing admin key: send 'Authorization: Bearer <admin key>' or 'x-api-key'")
    if not _is_admin(state, key):
        raise Unauthorized("invalid admin key (rollout keys cannot use the control API)")


async def authorize_rollout(request: Request, state: GatewayState, rollout_id: str | None) -> Rollout:
    """The rollout this model call belongs to (by its key, checked against the URL's rollout id)."""
    key = request_key(request)
    if key is None:
        raise Unauthorized("missing API key: send the rollout's key as 'Authorization: Bearer <key>'")
    if _is_admin(state, key):
        raise Unauthorized("the admin key cannot make model calls; use the rollout's own API key")
    try:
        if state.store.reads_at_once:  # a local file: a thread hop would cost more than the read
            rollout = state.store.get_rollout_by_key(key)
        else:
            rollout = await state.in_thread(state.store.get_rollout_by_key, key)
    except NotFound:
        raise Unauthorized("invalid API key") from None
    except RolloutUnreadable as exc:
        # The key is a rollout's, but its row cannot be read (a disk or a bad writer damaged it): its
        # status and sampling settings are unknown, so no call of it is served. A 409 the harness's SDK
        # does not retry (a 500 it retried, for nothing); its controller ends the rollout failed
        # (``fail_unreadable_rollout``). The damage itself is the admin's to read, not the harness's.
        if rollout_id is not None and exc.rollout_id != rollout_id:
            raise Forbidden("this API key belongs to another rollout") from None
        raise RolloutClosed(
            f"rollout {exc.rollout_id!r} cannot be read (its record in the store is damaged); "
            "it takes no more calls"
        ) from None
    if rollout_id is not None and rollout.rollout_id != rollout_id:
        raise Forbidden("this API key belongs to another rollout")
    return rollout


async def open_rollout(state: GatewayState, rollout: Rollout) -> Rollout:
    """A rollout that may take model calls: a queued one starts now; a closed one is refused (409)."""
    if rollout.status in TERMINAL_STATUSES:
        raise RolloutClosed(
            f"rollout {rollout.rollout_id!r} is {rollout.status.value}; it takes no more calls"
        )
    if rollout.status is RolloutStatus.QUEUED:
        # Only the attempt the key opened: a claim and a requeue since the key was read gave the
        # rollout a new attempt (and key), which this call must not start with no worker to run it.
        start = functools.partial(state.store.start_rollout, rollout.rollout_id, attempt=rollout.attempt)
        try:
            rollout = await state.in_thread(start)
        except InvalidTransition:  # RolloutEnded, or ended (cancelled, say) since the key was read
            raise RolloutClosed(
                f"rollout {rollout.rollout_id!r} attempt {rollout.attempt} has ended; it takes no more calls"
            ) from None
    return rollout
