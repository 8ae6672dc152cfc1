"""One gateway process for the multi-process gate tests (``test_gate_processes``).

``python tests/gateway/gate_node.py STORE_URL --lease S --delay S``: a scripted engine whose every
answer is a few tokens ``--delay`` seconds apart (so calls stay in flight long enough to be seen),
served by ``create_app`` + ``serve_in_thread`` exactly as the local stack serves its gateway; prints
``listening on URL`` once serving, stops on SIGTERM/SIGINT (SIGKILL: the lease takes it out).
"""

from __future__ import annotations

import argparse
import signal
import sys

from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.store import open_store

ADMIN_KEY = "test-admin-key"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait below
    store = open_store(args.store)
    engine = ScriptedEngine(["one two three four"], token_delay_s=args.delay)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY, lease_s=args.lease), store, engine)
    try:
        with serve_in_thread(app) as url:
            print(f"listening on {url}", flush=True)
            signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        store.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
