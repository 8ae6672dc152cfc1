"""Serving the gateway: ``run_gateway`` (the CLI's blocking entry point) and ``serve_in_thread`` (tests).

``run_gateway`` opens the store and builds the engine from typed config, generates and prints an
admin key if none was configured, and serves with uvicorn until SIGINT/SIGTERM (uvicorn's own
handlers: stop accepting, answer the calls held at a paused gate with a 503 at once
(``GatewayServer``), let in-flight requests end, run the lifespan shutdown), then closes the store. ``python -m harnessrl.gateway`` is the same without the typer CLI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette

from harnessrl.config import EngineConfig, GatewayConfig, validate_config
from harnessrl.errors import ConfigError
from harnessrl.gateway.inputs import check_gateway_inputs
from harnessrl.gateway.process import bind_socket, tune_gc, url_for
from harnessrl.gateway.transport.serving import GatewayServer, uvicorn_config

if TYPE_CHECKING:
    from harnessrl.gateway.app import RouteFactory
    from harnessrl.gateway.teacher import Teacher

log = logging.getLogger("harnessrl.gateway")


def _stop_on_signal(server: GatewayServer) -> Callable[[int, Any], None]:
    """The handler ``run_gateway`` installs under uvicorn's: it sets ``should_exit``.

    uvicorn re-raises the stop signal to it after its graceful shutdown (a no-op then: the server
    already stopped, and the process exits 0). A signal before uvicorn installs its own handlers
    stops the server as soon as it started; a handler that only logged lost it, and the gateway
    served on (as ``gateway.workers`` does for each worker).
    """

    def stop(signum: int, frame: Any) -> None:
        log.info("gateway stopped by signal %d", signum)
        server.should_exit = True

    return stop


def build_teacher(engine: EngineConfig) -> Teacher | None:
    """``engine.teacher``'s upstream, its key read from the environment variable it names (here, at
    the entry point, so the key is in this process only)."""
    cfg = engine.teacher
    if cfg is None:
        return None
    from harnessrl.gateway.teacher import Teacher

    key = None
    if cfg.api_key_env is not None:
        key = os.environ.get(cfg.api_key_env)
        if not key:
            raise ConfigError(f"engine.teacher.api_key_env: ${cfg.api_key_env} is not set")
    teacher = Teacher(
        cfg.base_url, cfg.model, key, timeout_s=cfg.timeout_s, api=cfg.api, length_field=cfg.length_field
    )
    teacher.probe()  # before serving: an unreachable upstream is a ConfigError (exit 2) naming engine
    return teacher


def run_gateway(
    gateway: GatewayConfig,
    engine: EngineConfig,
    store_url: str,
    *,
    extra_routes: Sequence[RouteFactory] = (),
    teacher: Teacher | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. Blocking. ``gateway.workers > 1``: that many processes (``run_workers``).

    ``extra_routes``: routes the app serves beside the gateway's own (``create_app``), e.g. the
    dashboard's ``/ui``; the caller composing the gateway chooses them. ``teacher``: teacher mode's
    upstream (``build_teacher``; built from ``engine.teacher`` when not given).
    """
    from harnessrl.engines.factory import create_engine
    from harnessrl.gateway.app import create_app
    from harnessrl.store import open_store

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    generated = gateway.admin_key is None
    if generated:
        gateway = gateway.model_copy(update={"admin_key": f"hrl-admin-{secrets.token_urlsafe(24)}"})
    if gateway.workers > 1:
        from harnessrl.gateway.workers import check_workers_config, run_workers

        check_workers_config(gateway, engine, store_url)  # before a key is printed for a refused config
        if generated:
            print(f"harnessrl gateway admin key: {gateway.admin_key}", flush=True)
        run_workers(gateway, engine, store_url, extra_routes=extra_routes)
        return
    sock = bind_socket(gateway.host, gateway.port)
    port = sock.getsockname()[1]
    url = url_for(gateway.host, port)
    store = open_store(store_url)
    try:
        if teacher is None:  # first: an unreachable upstream fails before a model loads
            teacher = build_teacher(engine)
        policy = create_engine(engine)
        app = create_app(gateway, store, policy, extra_routes=extra_routes, teacher=teacher)
        if generated:
            print(f"harnessrl gateway admin key: {gateway.admin_key}", flush=True)
        print(f"harnessrl gateway listening on {url} (store {store_url}, model {engine.model})", flush=True)
        config = uvicorn_config(app, gateway, log_level="info", timeout_graceful_shutdown=30)
        server = GatewayServer(config)
        tune_gc()
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler
        # that was installed before it: this one, so a requested stop exits with status 0.
        stop = _stop_on_signal(server)
        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.run(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        sock.close()
        store.close()
    if server.started is False:
        raise ConfigError("gateway failed to start (see the log above)")


@contextlib.contextmanager
def serve_in_thread(
    app: Starlette,
    host: str = "127.0.0.1",
    timeout_s: float = 30.0,
    *,
    sock: socket.socket | None = None,
    port: int = 0,
) -> Iterator[str]:
    """Run ``app`` with a real uvicorn server on ``port`` (0: a free one) in a background thread;
    yields its URL.

    For tests and notebooks: the lifespan runs (engine started), and leaving the block shuts the
    server down cleanly. uvicorn installs no signal handlers off the main thread. ``sock``: a
    listening socket bound beforehand (e.g. so peer gateways can be told each other's URL); it is
    closed at the end. Connections are served as ``run_gateway`` serves them (``gateway.transport``),
    with the timeouts and limits of the app's ``GatewayConfig`` (a training run's local stack serves
    its gateway this way).
    """
    if sock is None:
        sock = bind_socket(host, port)
    else:
        host = sock.getsockname()[0]
    port = sock.getsockname()[1]
    from harnessrl.gateway.app import GatewayApp

    # A gateway is served with its own connection settings; another app (a test's fake upstream)
    # with the defaults.
    gateway = app.gateway.config if isinstance(app, GatewayApp) else GatewayConfig()
    config = uvicorn_config(app, gateway, log_level="warning", timeout_graceful_shutdown=5)
    server = GatewayServer(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"gateway:{port}", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"gateway test server on port {port} did not start")
        time.sleep(0.01)
    try:
        yield url_for(host, port)
    finally:
        server.should_exit = True
        thread.join(timeout=timeout_s)
        sock.close()


def main(argv: list[str] | None = None, *, extra_routes: Sequence[RouteFactory] = ()) -> None:
    """``python -m harnessrl.gateway --model M --port P --store S [--host H] [--workers N]``
    (admin key from env)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m harnessrl.gateway", description=main.__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--store", default="runs/gateway/harnessrl.db")
    parser.add_argument("--workers", type=int, default=1, help="gateway processes behind this address")
    parser.add_argument("--tokenizer", default=None, help="the policy's tokenizer (remote engines)")
    args = parser.parse_args(argv)
    try:
        # validate_config: a bad value (``--workers 0``, ``--port 99999``, a key with a space) is an
        # error naming its setting, as ``harnessrl gateway`` gives, not pydantic's traceback.
        gateway = validate_config(
            GatewayConfig,
            {
                "host": args.host,
                "port": args.port,
                "admin_key": os.environ.get("HARNESSRL_ADMIN_KEY") or None,
                "workers": args.workers,
            },
            where="gateway",
        )
        engine = validate_config(
            EngineConfig, {"model": args.model, "tokenizer": args.tokenizer}, where="engine"
        )
        # Before the store is created, as ``harnessrl gateway`` checks them.
        check_gateway_inputs(
            gateway,
            engine,
            args.store,
            model_field="--model",
            store_field="--store",
            tokenizer_field="--tokenizer",
        )
        run_gateway(
            gateway,
            engine,
            args.store,
            extra_routes=extra_routes,
        )
    except ConfigError as exc:
        print(f"harnessrl gateway: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
