"""Dashboard authentication: only the admin key opens it, never a rollout key.

The key arrives as ``Authorization: Bearer KEY``/``x-api-key``, once as ``?key=KEY`` (answered with
a redirect that drops it from the URL), or through the login form. The last two set an HttpOnly,
SameSite=Strict cookie holding an HMAC of the admin key (not the key itself), so the cookie is
useless anywhere else. No key: 401 with the login form; a wrong key (a rollout's included): 403.

The cookie's name carries a fingerprint of that HMAC (``harnessrl_dashboard_<8 hex>``,
``cookie_name``): browsers keep cookies per host, not per port, so two dashboards on one host (two
``harnessrl dashboard`` commands, a gateway's ``/ui`` beside one) would otherwise overwrite each
other's cookie and sign each other out. Each reads only its own; another dashboard's cookie counts
as no cookie (401, sign in).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qs, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from harnessrl.dashboard.html import PAGE_HEADERS, esc, page

COOKIE_PREFIX = "harnessrl_dashboard_"
#: The largest sign-in form read (a key and a ``next`` URL are far smaller); a longer body gets 413.
MAX_LOGIN_BYTES = 16 * 1024


def session_token(admin_key: str) -> str:
    return hmac.new(admin_key.encode(), b"harnessrl-dashboard-session", hashlib.sha256).hexdigest()


def cookie_name(admin_key: str) -> str:
    """This dashboard's cookie: the prefix and 8 hex digits of a hash of its session token (which
    the name then reveals nothing about: 32 bits of a SHA-256 of an HMAC)."""
    fingerprint = hashlib.sha256(session_token(admin_key).encode()).hexdigest()[:8]
    return COOKIE_PREFIX + fingerprint


def _header_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def login_page(prefix: str, next_url: str, *, status_code: int, message: str) -> HTMLResponse:
    body = (
        f'<div class="card" style="max-width:420px"><h1>Sign in</h1><p>{esc(message)}</p>'
        f'<form method="post" action="{esc(prefix)}/login">'
        f'<input type="hidden" name="next" value="{esc(next_url)}">'
        '<label>Admin key <input type="password" name="key" autofocus required></label> '
        '<button type="submit">Open dashboard</button></form></div>'
    )
    return HTMLResponse(page("Sign in", body, prefix=prefix), status_code=status_code, headers=PAGE_HEADERS)


def _with_cookie(response: Response, admin_key: str, secure: bool) -> Response:
    response.set_cookie(
        cookie_name(admin_key),
        session_token(admin_key),
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/",
    )
    return response


def check(request: Request, admin_key: str, prefix: str) -> Response | None:
    """``None`` when the request is the admin's; otherwise the response to send instead."""
    secure = request.url.scheme == "https"
    query_key = request.query_params.get("key")
    if query_key is not None:
        if not _same(query_key, admin_key):
            return login_page(
                prefix, prefix + "/", status_code=403, message="That key does not open the dashboard."
            )
        params = [(k, v) for k, v in request.query_params.multi_items() if k != "key"]
        target = request.url.path + ("?" + urlencode(params) if params else "")
        return _with_cookie(RedirectResponse(target, status_code=303), admin_key, secure)
    header_key = _header_key(request)
    if header_key is not None:
        if _same(header_key, admin_key):
            return None
        return login_page(
            prefix, request.url.path, status_code=403, message="That key does not open the dashboard."
        )
    cookie = request.cookies.get(cookie_name(admin_key))
    if cookie is not None and _same(cookie, session_token(admin_key)):
        return None
    if cookie is not None:
        return login_page(prefix, request.url.path, status_code=403, message="Your session is not valid.")
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return login_page(prefix, target, status_code=401, message="Enter the run's admin key.")


async def _small_body(request: Request, limit: int) -> bytes | None:
    """The request body, or ``None`` once it is longer than ``limit`` bytes: whoever can reach the
    route can send one, key or not, so it is never read whole into memory. A declared length is
    refused before reading; a body without one (chunked) is counted as it streams in."""
    try:
        declared = int(request.headers.get("content-length", "0"))
    except ValueError:
        return None
    if declared > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def login(request: Request, admin_key: str, prefix: str) -> Response:
    """POST of the login form (url-encoded; parsed here so python-multipart is not needed)."""
    raw = await _small_body(request, MAX_LOGIN_BYTES)
    if raw is None:
        return login_page(prefix, prefix + "/", status_code=413, message="That sign-in form is too large.")
    form = parse_qs(raw.decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0]
    next_url = (form.get("next") or [prefix + "/"])[0]
    if not next_url.startswith(prefix + "/") and next_url != prefix:
        next_url = prefix + "/"  # never redirect off the dashboard (open redirect)
    if not _same(key, admin_key):
        return login_page(prefix, next_url, status_code=403, message="That key does not open the dashboard.")
    return _with_cookie(RedirectResponse(next_url, status_code=303), admin_key, request.url.scheme == "https")
