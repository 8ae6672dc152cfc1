"""The gate across gateways: pause -> drained and resume -> first admitted call, 1/4/16 processes.

What is measured. N real gateway processes (``python -m harnessrl.gateway``, a scripted engine, one
throwaway PostgreSQL database shared by all; started exactly as users start them) and, per cycle:

- ``pause``: the wall time of ``POST /api/pause`` on gateway 0 until it answers ``drained: true``
  (every gateway has closed its gate and has no call in flight; none is generating here, so this is
  the protocol's own cost: reaching every gateway and hearing back from all of them);
- ``resume``: a call is held at gateway N-1's closed gate (its own ``/api/state`` shows it waiting),
  then ``POST /api/resume`` on gateway 0; the time from sending the resume until that held call's
  answer arrives (the scripted answer is a few tokens: the call's own time is ~1-2 ms).

Two protocols side by side, in one run:

- ``before``: the cluster protocol this replaced (``--peer`` lists, HTTP fan-out with scopes, Lamport
  stamps), run from a checkout of the older code (``--before-src``: a ``git worktree`` of the commit
  before; its ``src``). Every gateway lists every other as a peer.
- ``after``: this checkout: the gate and heartbeat rows in the store, woken by LISTEN/NOTIFY; no
  gateway knows another's address.

Both protocols' N gateways run at the same time (separate databases) and their cycles alternate,
so the shared machine's changing load falls on both alike.

The machine is shared and small (2 cores): 16 gateway processes plus PostgreSQL plus this client
contend for it, so absolute times are upper bounds; the 1-minute load average is recorded around each
batch. Compare the two protocols at the same N, not across machines.

Run::

    git worktree add --detach /tmp/gate-before <commit before>
    .venv/bin/python benchmarks/gateway_gate.py --before-src /tmp/gate-before/src
    git worktree remove /tmp/gate-before

Writes ``benchmarks/results/gateway_gate.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from harnessrl.store.pg_server import ThrowawayPostgres

ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY = "bench-admin-key"
HEADERS = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHAT = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Fleet:
    """N gateway processes of one protocol on one database."""

    def __init__(self, protocol: str, src: Path, n: int, store_url: str, script: Path) -> None:
        self.protocol, self.n = protocol, n
        ports = free_ports(n)
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]
        env = {**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY, "PYTHONPATH": str(src)}
        self.procs = []
        for i, port in enumerate(ports):
            args = [sys.executable, "-m", "harnessrl.gateway", "--port", str(port)]
            args += ["--model", f"scripted:{script}", "--store", store_url]
            if protocol == "before":
                for j, url in enumerate(self.urls):
                    if j != i:
                        args += ["--peer", url]
            self.procs.append(
                subprocess.Popen(
                    args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        self.http = httpx.Client(headers=HEADERS, timeout=120)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 300
        while True:
            try:
                state = self.http.get(f"{self.urls[0]}/api/state").json()
                # every process answers (before: a fan-out to all; after: all registered)
                if len(state.get("gateways", [None])) == self.n and all(
                    self.http.get(f"{u}/api/health").status_code == 200 for u in self.urls
                ):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{self.protocol}: {self.n} gateways did not come up")
            time.sleep(0.2)

    def own_waiting(self, url: str) -> int:
        if self.protocol == "before":
            return int(self.http.get(f"{url}/api/state", params={"scope": "process"}).json()["waiting"])
        (own,) = [g for g in self.http.get(f"{url}/api/state").json()["gateways"] if g["self"]]
        return int(own["waiting"])

    def cycle(self) -> tuple[float, float]:
        """(pause -> drained, resume -> the held call answered), in milliseconds."""
        start = time.perf_counter()
        answer = self.http.post(f"{self.urls[0]}/api/pause", params={"timeout": 60}).json()
        pause_ms = (time.perf_counter() - start) * 1000
        assert answer.get("drained") is True, answer
        rollout = self.http.post(f"{self.urls[0]}/api/rollouts", json={"task": {}}).json()
        answered: list[float] = []
        last = self.urls[-1]

        def held() -> None:
            r = httpx.post(
                f"{last}/rollouts/{rollout['rollout_id']}/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {rollout['api_key']}"},
                timeout=120,
            )
            answered.append(time.perf_counter())
            assert r.status_code == 200, r.text

        thread = threading.Thread(target=held)
        thread.start()
        while self.own_waiting(last) < 1:
            time.sleep(0.005)
        start = time.perf_counter()
        self.http.post(f"{self.urls[0]}/api/resume").raise_for_status()
        thread.join(timeout=120)
        return pause_ms, (answered[0] - start) * 1000

    def close(self) -> None:
        self.http.close()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "max_ms": round(ordered[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before-src", type=Path, required=True, help="src/ of the older checkout")
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gateway_gate.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: list[dict[str, Any]] = []
    with ThrowawayPostgres() as server, tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(["ok"]))
        for n in sizes:
            # Both protocols' gateways run at once and their cycles alternate, so a change in the
            # shared machine's load hits both alike.
            fleets: dict[str, Fleet] = {}
            names = []
            try:
                for protocol, src in (("before", args.before_src), ("after", ROOT / "src")):
                    name = f"g_{protocol}_{n}_{uuid.uuid4().hex[:6]}"
                    names.append(name)
                    fleets[protocol] = Fleet(protocol, src, n, server.create_database(name), script)
                for fleet in fleets.values():
                    fleet.cycle()  # warm-up: connections, first pause
                load_before = os.getloadavg()[0]
                times: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in fleets}
                for i in range(args.cycles):
                    order = list(fleets) if i % 2 == 0 else list(reversed(fleets))
                    for protocol in order:
                        pause_ms, resume_ms = fleets[protocol].cycle()
                        times[protocol][0].append(pause_ms)
                        times[protocol][1].append(resume_ms)
                load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                for protocol, (pauses, resumes) in times.items():
                    row = {
                        "gateways": n,
                        "protocol": protocol,
                        "cycles": args.cycles,
                        "pause_to_drained": summary(pauses),
                        "resume_to_first_call": summary(resumes),
                        "load_avg_1m": load,
                    }
                    print(json.dumps(row), flush=True)
                    results.append(row)
            finally:
                for fleet in fleets.values():
                    fleet.close()
                for name in names:
                    server.drop_database(name)
    out = {
        "benchmark": "gateway_gate",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "note": "2 shared cores; every gateway, PostgreSQL and the client on this machine",
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
