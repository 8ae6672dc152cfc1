"""``run_workers``: N gateway processes serving one address, sharing one store (``gateway.workers``).

Each worker listens on the public address with its own SO_REUSEPORT socket, so the kernel spreads
new connections evenly over the workers. (One listening socket shared by all, as gunicorn does,
spreads badly here: asyncio accepts every pending connection in one wake-up, so the worker that
wakes first takes a whole burst of clients, and keep-alive keeps them there.) The parent binds the
port first without listening, which resolves ``port = 0`` and holds the port for the workers.
The workers agree on pause and policy version through the store as any gateways sharing it do
(``gateway.control.cluster``): ``/api/pause`` on the public address, whichever worker takes it, pauses all.
Each worker also gets a private loopback control socket, printed at start, to reach one given
process (its own ``/metrics``, its own row in ``/api/state``); nothing is forwarded through it.
The cap on a key's requests in flight (``gateway.max_requests_per_key``) is counted in memory the
workers share (``key_limits.SharedKeyCounts``): counted per process, a key whose connections the
kernel spread over N workers had N times the cap in flight.
``GET /metrics`` on the public address answers for all of them (``WholeMetrics``): the worker that
takes it scrapes every worker's control socket with the caller's credentials and merges the answers,
each series labelled ``worker="i"``. Answered by whichever worker the kernel picked, as before, the
counters jumped back and forth between scrapes and a rate over them was noise.

Each worker opens its own store connection and its own engine. That is why only remote engines
(``vllm:``/``sglang:``: the workers share the inference servers) and the scripted engine are
allowed: an embedded model would be loaded N times and a weight update would reach one copy.

The parent forwards SIGINT/SIGTERM to the workers and waits for them; if a worker ends without the
parent having stopped it — a crash, or a clean exit (status 0) after a SIGTERM someone sent to that
worker alone — the parent stops the others and fails (the address would serve on with fewer
processes unnoticed). A worker gets SIGTERM when its parent dies however it dies (``PR_SET_PDEATHSIG``):
a parent SIGKILLed (the OOM killer, ``kill -9``) left its workers serving the port forever.

SO_REUSEPORT lets any process of the same user join the port's group, so a second ``--workers``
gateway started on a port in use would share its connections with the first (another store, another
gate: half the calls answered by the wrong gateway, a pause reaching half the processes). The
parent holds a lock named after the port (``hold_port``) that the workers inherit; a second gateway
on that port is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import httpx
from starlette.requests import Request
from starlette.responses import Response

from harnessrl.config import EngineConfig, GatewayConfig
from harnessrl.errors import ConfigError
from harnessrl.gateway.auth import is_admin_request
from harnessrl.gateway.key_limits import KeyCounts, LocalKeyCounts, PerKeyLimit, SharedKeyCounts
from harnessrl.gateway.process import bind_socket, tune_gc, url_for

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from harnessrl.gateway.app import GatewayApp, RouteFactory
    from harnessrl.gateway.state import GatewayState

log = logging.getLogger("harnessrl.gateway")


def check_workers_config(gateway: GatewayConfig, engine: EngineConfig, store_url: str) -> None:
    """``ConfigError`` for settings several worker processes cannot run with."""
    if engine.teacher is not None:
        raise ConfigError("engine.teacher: teacher mode runs in one gateway process (gateway.workers = 1)")
    if engine.source.kind == "embedded":
        raise ConfigError(
            f"gateway.workers = {gateway.workers} needs a remote engine (vllm:URL or sglang:URL) or a "
            f"scripted: engine, not {engine.model!r}: each worker would load its own copy of an "
            "embedded model and a weight update would reach only one of them"
        )
    if store_url.strip() in (":memory:", "sqlite://:memory:", "sqlite:///:memory:"):
        raise ConfigError(
            f"gateway.workers = {gateway.workers} needs a store the workers share "
            "(a PostgreSQL URL or a SQLite file), not :memory:"
        )


def hold_port(host: str, port: int) -> socket.socket | None:
    """A lock on ``port`` among this host's ``--workers`` gateways (``None`` where there is no such
    lock: not Linux). ``ConfigError`` naming ``gateway.port`` if another one holds it.

    An abstract Unix socket's name: the kernel frees it when the last process holding it ends, even
    by SIGKILL, and its namespace is the network namespace's, as the port's is. Keyed by the port
    alone: a group on 127.0.0.1 would take the loopback connections of one on 0.0.0.0 too."""
    if not sys.platform.startswith("linux"):
        return None
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0harnessrl-gateway-workers-port-{port}")
    except OSError as exc:
        lock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(
            f"gateway.port: cannot listen on {host}:{port}: another harnessrl gateway with workers "
            "serves that port (the two would share its connections); stop it or choose another port"
        ) from None
    return lock


def run_workers(
    gateway: GatewayConfig,
    engine: EngineConfig,
    store_url: str,
    *,
    extra_routes: Sequence[RouteFactory] = (),
) -> None:
    """Serve with ``gateway.workers`` processes until SIGINT/SIGTERM. Blocking. ``admin_key`` must be set.

    ``extra_routes``: as for ``create_app``; each worker builds them on its own store and engine.
    """
    check_workers_config(gateway, engine, store_url)
    assert gateway.admin_key, "run_gateway sets the admin key before starting workers"
    reserved = bind_socket(gateway.host, gateway.port, reuse_port=True, listen=False)  # takes no calls
    port = reserved.getsockname()[1]
    try:
        lock = hold_port(gateway.host, port)  # the workers inherit it: held until the last one ends
    except ConfigError:
        reserved.close()
        raise
    controls = [bind_socket("127.0.0.1", 0) for _ in range(gateway.workers)]
    key_counts = shared_key_counts()  # before the fork: every worker maps the same memory
    control_urls = [url_for("127.0.0.1", s.getsockname()[1]) for s in controls]
    url = url_for(gateway.host, port)
    # fork: the control sockets are inherited as they are, and nothing is open yet that a child could
    # not share (the store and engine are opened in each worker).
    ctx = multiprocessing.get_context("fork")
    workers = []
    for i in range(gateway.workers):
        proc = ctx.Process(
            target=_serve_worker,
            args=(
                i,
                gateway,
                engine,
                store_url,
                port,
                controls[i],
                tuple(control_urls),
                key_counts,
                tuple(extra_routes),
                os.getpid(),
            ),
            name=f"harnessrl-gateway-{i}",
        )
        proc.start()
        workers.append(proc)
    for sock in controls:
        sock.close()
    print(
        f"harnessrl gateway listening on {url} ({gateway.workers} workers, control "
        f"{', '.join(control_urls)}; store {store_url}, model {engine.model})",
        flush=True,
    )
    stopping = {"signal": 0}

    def forward(signum: int, frame: object) -> None:
        stopping["signal"] = signum
        for proc in workers:
            if proc.pid is not None and proc.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed: list[str] = []
    try:
        while any(p.is_alive() for p in workers):
            for proc in workers:
                proc.join(timeout=0.2)
                # Any exit the parent did not cause, a clean one too: a worker stopped alone by a
                # signal exits with 0 (uvicorn's graceful shutdown), and the others would serve on.
                if not proc.is_alive() and not stopping["signal"]:
                    failed.append(f"{proc.name} (pid {proc.pid}) exited on its own with {proc.exitcode}")
                    forward(signal.SIGTERM, None)
                    stopping["signal"] = -1
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reserved.close()
        if lock is not None:
            lock.close()
    if failed:
        raise ConfigError("gateway worker failed: " + "; ".join(failed) + " (see the log above)")


def _serve_worker(
    index: int,
    gateway: GatewayConfig,
    engine: EngineConfig,
    store_url: str,
    port: int,
    control: socket.socket,
    control_urls: Sequence[str],
    key_counts: KeyCounts,
    extra_routes: Sequence[RouteFactory],
    parent_pid: int,
) -> None:
    """One worker process: its own store connection, engine and app, on the public + its control socket."""
    end_with_parent(parent_pid)
    public = bind_socket(gateway.host, port, reuse_port=True)

    from harnessrl.engines.factory import create_engine
    from harnessrl.gateway.app import create_app
    from harnessrl.gateway.transport.serving import GatewayServer, uvicorn_config
    from harnessrl.store import open_store

    store = open_store(store_url)
    try:
        app = worker_app(
            create_app(gateway, store, create_engine(engine), shared_store=True, extra_routes=extra_routes),
            public_port=port,
            control_urls=control_urls,
            key_counts=key_counts,
        )
        # The connection settings and limits apply per worker process.
        config = uvicorn_config(app, gateway, log_level="info", timeout_graceful_shutdown=30)
        server = GatewayServer(config)
        tune_gc()  # as run_gateway does
        log.info("gateway worker %d (pid %d) serving", index, os.getpid())
        # As in run_gateway, uvicorn re-raises the stop signal to the previous handler: this one. A
        # signal before uvicorn installs its own (the parent's, or its death's) stops the server as
        # soon as it started; a no-op here lost it, and the worker served on.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, frame: setattr(server, "should_exit", True))
        server.run(sockets=[public, control])
    finally:
        store.close()
    if not server.started:
        raise SystemExit(1)


#: ``prctl``'s option for the signal a process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


def end_with_parent(parent_pid: int) -> None:
    """SIGTERM this worker when its parent dies (Linux), and end now if it died already."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning(
            "gateway worker %d: prctl(PR_SET_PDEATHSIG) failed: %s",
            os.getpid(),
            os.strerror(ctypes.get_errno()),
        )
    if os.getppid() != parent_pid:  # it died before the prctl: no signal will come
        raise SystemExit(0)


#: Seconds a scrape waits for one worker's ``/metrics``; a worker that does not answer is ``up 0``.
SCRAPE_TIMEOUT_S = 5.0
#: The request headers a scrape forwards to each worker: the caller's credentials, checked there.
_CREDENTIALS = (b"authorization", b"x-api-key")


def shared_key_counts() -> KeyCounts:
    """The workers' shared per-key counts; each worker's own (with a warning) where the system
    cannot share a lock between processes (no ``/dev/shm``)."""
    try:
        return SharedKeyCounts()
    except OSError as exc:
        log.warning(
            "gateway.max_requests_per_key is counted per worker process (%s): a key may have up to "
            "gateway.workers times as many requests in flight",
            exc,
        )
        return LocalKeyCounts()


def worker_app(
    app: GatewayApp, *, public_port: int, control_urls: Sequence[str], key_counts: KeyCounts
) -> WholeMetrics:
    """A worker's gateway ``app`` with what makes the workers one gateway: the per-key cap counted
    across them (the app's own per-process cap inside it then never refuses first) and the whole
    ``/metrics`` on the public port."""
    state = app.gateway
    limited = PerKeyLimit(
        app,
        state.config.max_requests_per_key,
        on_refused=lambda: state.metrics.errors.labels(code="overloaded").inc(),
        counts=key_counts,
    )
    return WholeMetrics(limited, gateway=state, public_port=public_port, control_urls=control_urls)


class WholeMetrics:
    """ASGI wrapper: ``GET /metrics`` on the public port is every worker's (``merge_worker_metrics``);
    everything else, the control sockets' ``/metrics`` included, goes to ``app`` unchanged.
    ``gateway``: the app's ``GatewayState`` (``GatewayServer`` tells it when the shutdown starts)."""

    def __init__(
        self, app: ASGIApp, *, gateway: GatewayState, public_port: int, control_urls: Sequence[str]
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.public_port = public_port
        self.control_urls = tuple(control_urls)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Not the admin: the app answers (its 401), and no one makes the workers scrape each other.
        if not self._is_public_scrape(scope) or not is_admin_request(Request(scope), self.gateway):
            await self.app(scope, receive, send)
            return
        from harnessrl.gateway.metrics import merge_worker_metrics

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _CREDENTIALS}
        answers = await asyncio.gather(*(_scrape(url, headers) for url in self.control_urls))
        body = merge_worker_metrics(answers)
        response = Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
        await response(scope, receive, send)

    def _is_public_scrape(self, scope: Scope) -> bool:
        server = scope.get("server")
        return (
            scope["type"] == "http"
            and scope["path"] == "/metrics"
            and scope["method"] == "GET"
            and server is not None
            and server[1] == self.public_port
        )


async def _scrape(url: str, headers: dict[str, str]) -> str | None:
    """``url``'s ``/metrics`` (a worker's control socket); ``None`` if it did not answer it in time."""
    try:
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S, trust_env=False) as client:
            answer = await client.get(f"{url}/metrics", headers=headers)
    except httpx.HTTPError:
        return None
    return answer.text if answer.status_code == 200 else None
