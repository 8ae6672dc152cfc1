"""Several gateway processes as one: pause/resume fan-out to peers, ordered so no pause is lost.

A gateway may have peers: its sibling worker processes on the same node (``--workers N``, each
reachable on a private loopback control port) and gateways on other nodes (``[gateway] peers``).
``POST /api/pause`` on any of them closes its own gate and forwards the pause to every peer, and
answers only when every gateway has drained; ``/api/resume`` likewise; ``/api/state`` reports each
gateway. The store is already shared (call seqs come from it atomically), so pause/resume is the only
state the gateways must agree on, and a broadcast is enough: no extra table, no polling.

Fan-out scope keeps a forwarded command from being forwarded again: the gateway the trainer called
(scope ``cluster``) forwards to its siblings with scope ``process`` and to remote peers with scope
``node``; a ``node`` gateway forwards to its own siblings with scope ``process``; a ``process``
gateway only acts on itself. So each process is reached exactly once.

Ordering. Two commands can race (a trainer's resume and the next pause; two trainers). Each command
carries an order stamp ``(counter, origin)`` from a Lamport clock: the origin takes
``counter = clock + 1``, and every gateway that sees a stamp moves its clock past it. A gateway applies
a command only if its stamp is newer than the last one it applied, so all gateways end in the state
of the newest command whatever order the messages arrive in, and a command issued after another
returned always wins over it. A pause that a newer resume overtook answers 409 (``Conflict``): the
trainer must not think the gateways are quiet. A pause that is older than a newer pause still waits
for the drain and succeeds, so concurrent pauses are idempotent.

A peer that cannot be reached makes the command fail with 502 (``UpstreamError``) naming it; the
gateways that were reached keep the command (a half-applied pause is safe: calls just wait).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from harnessrl.errors import BadRequest, Conflict, HarnessRLError, UpstreamError

Scope = Literal["cluster", "node", "process"]
SCOPES: tuple[Scope, ...] = ("cluster", "node", "process")
Kind = Literal["pause", "resume"]
Order = tuple[int, str]


def parse_order(raw: str | None) -> Order | None:
    """``"12.ab34"`` -> ``(12, "ab34")``; ``None`` when absent."""
    if raw is None:
        return None
    counter, sep, origin = raw.partition(".")
    # isascii: str.isdigit() is true of "²", which int() refuses; 19 digits keep it a 64-bit counter.
    if not sep or not origin or not (counter.isascii() and counter.isdigit()) or len(counter) > 18:
        raise BadRequest("query parameter 'order' must look like COUNTER.ORIGIN", param="order")
    return int(counter), origin


def format_order(order: Order) -> str:
    return f"{order[0]}.{order[1]}"


def parse_scope(raw: str | None) -> Scope:
    if raw is None:
        return "cluster"
    if raw not in SCOPES:
        raise BadRequest(f"query parameter 'scope' must be one of {', '.join(SCOPES)}", param="scope")
    return raw  # type: ignore[return-value]


@dataclass
class Cluster:
    """This gateway's peers and the order of the pause/resume commands it has applied."""

    siblings: tuple[str, ...] = ()  # control URLs of the other worker processes on this node
    remotes: tuple[str, ...] = ()  # gateways on other nodes (``[gateway] peers``)
    admin_key: str = ""
    origin: str = field(default_factory=lambda: secrets.token_hex(4))
    clock: int = 0
    last: Order = (0, "")  # stamp of the last applied command
    last_kind: Kind = "resume"
    connect_timeout_s: float = 10.0
    _http: httpx.AsyncClient | None = None

    @property
    def shares_store(self) -> bool:
        """Whether other gateways write calls into this gateway's store (its caches can go stale)."""
        return bool(self.siblings or self.remotes)

    def targets(self, scope: Scope) -> list[tuple[str, Scope]]:
        """(peer URL, scope to forward with) for a command received with ``scope``."""
        if scope == "process":
            return []
        out: list[tuple[str, Scope]] = [(url, "process") for url in self.siblings]
        if scope == "cluster":
            out += [(url, "node") for url in self.remotes]
        return out

    def stamp(self, order: Order | None) -> Order:
        """The order of a command: a new stamp at its origin, else the one it came with."""
        if order is None:
            self.clock += 1
            return self.clock, self.origin
        self.clock = max(self.clock, order[0])
        return order

    def apply(self, order: Order, kind: Kind) -> bool:
        """Record ``kind`` as the current command if ``order`` is the newest seen; ``False`` if stale."""
        if order <= self.last:
            return False
        self.last, self.last_kind = order, kind
        return True

    async def forward(
        self,
        method: str,
        path: str,
        scope: Scope,
        order: Order | None,
        timeout_s: float | None,
        extra: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Send a control request to every peer for ``scope``; their JSON answers, in peer order.

        Every peer is tried even if one fails; then the first failure is raised, naming the peer.
        """
        targets = self.targets(scope)
        if not targets:
            return []
        if self._http is None:
            self._http = httpx.AsyncClient(headers={"Authorization": f"Bearer {self.admin_key}"})
        # A pause waits up to its drain timeout; anything else should answer at once.
        read_timeout = 30.0 if timeout_s is None else timeout_s + 30.0

        async def one(url: str, peer_scope: Scope) -> dict[str, Any]:
            params: dict[str, str] = {"scope": peer_scope}
            if order is not None:
                params["order"] = format_order(order)
            if timeout_s is not None:
                params["timeout"] = str(timeout_s)
            params.update(extra or {})
            timeout = httpx.Timeout(read_timeout, connect=self.connect_timeout_s)
            try:
                response = await self._http.request(  # type: ignore[union-attr]
                    method, f"{url.rstrip('/')}{path}", params=params, timeout=timeout
                )
            except httpx.HTTPError as exc:
                raise UpstreamError(f"gateway peer {url} unreachable: {exc!r}") from exc
            try:
                body = response.json()
            except ValueError:
                body = {}
            if response.status_code == 409:
                raise Conflict(f"gateway peer {url}: {_message(body, response)}")
            if response.status_code >= 400:
                raise UpstreamError(
                    f"gateway peer {url} answered {response.status_code}: {_message(body, response)}"
                )
            return {"url": url, **body}

        results = await asyncio.gather(*(one(u, s) for u, s in targets), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, HarnessRLError):
                    raise result
                raise UpstreamError(f"gateway peer request failed: {result!r}") from result
        return list(results)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _message(body: Any, response: httpx.Response) -> str:
    try:
        return str(body["error"]["message"])
    except (KeyError, TypeError):
        return response.text[:300]


def aggregate(local: dict[str, Any], peers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One answer for the whole fan-out: this gateway's fields, totals, and each gateway's own."""
    if not peers:
        return local
    everyone = [{"url": "self", **local}, *peers]
    out = dict(local)
    out["paused"] = all(g.get("paused") for g in everyone)
    out["in_flight"] = sum(int(g.get("in_flight", 0)) for g in everyone)
    out["waiting"] = sum(int(g.get("waiting", 0)) for g in everyone)
    if "drained" in local:
        out["drained"] = all(g.get("drained", False) for g in everyone)
    if "released" in local:
        out["released"] = sum(int(g.get("released", 0)) for g in everyone)
    # A node peer answers for its own siblings too: flatten so every process is listed once.
    flat: list[dict[str, Any]] = [{k: v for k, v in local.items() if k != "gateways"} | {"url": "self"}]
    for peer in peers:
        nested = peer.get("gateways")
        if nested:
            flat += [{**g, "url": peer["url"] if g.get("url") == "self" else g.get("url")} for g in nested]
        else:
            flat.append(peer)
    out["gateways"] = flat
    return out
