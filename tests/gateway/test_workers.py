"""``harnessrl gateway --workers 2`` as users start it: the parent process and its workers' lives.

Real processes of the real CLI on 127.0.0.1 (a scripted engine, a SQLite file the workers share),
the control API through ``GatewayClient``. What the workers do together (pause, resume, calls in
order) is in ``test_multi_gateway``; here, what happens around them: the parent dying, another
gateway started on their port, and the settings ``python -m harnessrl.gateway`` refuses; and what
must hold of the workers as one gateway though each is its own process: a resume answered once
every worker applied it, one ``/metrics`` for all, one per-key cap for all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import httpx
import openai
import pytest

from harnessrl.client import GatewayClient
from harnessrl.errors import UpstreamError

ADMIN_KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
ROOT = Path(__file__).resolve().parents[2]
HARNESSRL = [sys.executable, "-m", "harnessrl"]


class Workers:
    """One ``harnessrl gateway --workers 2`` process (the parent) and what it printed."""

    def __init__(self, tmp_path: Path, name: str, port: int = 0, extra: Sequence[str] = ()) -> None:
        script = tmp_path / "script.json"
        script.write_text(json.dumps(["Hello there."]))
        self.proc = subprocess.Popen(
            [
                *HARNESSRL,
                "gateway",
                "--workers",
                "2",
                "--port",
                str(port),
                "--model",
                f"scripted:{script}",
                "--store",
                str(tmp_path / f"{name}.db"),
                *extra,
            ],
            cwd=ROOT,
            env={**os.environ, "HARNESSRL_ADMIN_KEY": ADMIN_KEY},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.url: str | None = None
        self.controls: list[str] = []  # each worker's own loopback control URL, in worker order
        self.output: list[str] = []
        self.children: list[int] = []

    def wait_listening(self) -> str | None:
        """The URL once the parent says it listens; ``None`` if it exited first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "listening on" in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                self.controls = line.split("control ", 1)[1].split(";", 1)[0].split(", ")
                threading.Thread(target=self._drain, daemon=True).start()
                return self.url
        self.proc.wait()
        return None

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def wait_serving(self) -> None:
        """Until both workers registered in the store; then their pids are known."""
        assert self.url is not None
        deadline = time.monotonic() + 120
        with GatewayClient(self.url, ADMIN_KEY) as client:
            while True:
                with contextlib.suppress(UpstreamError):
                    if len(client.state().get("gateways", [])) == 2:
                        break
                assert time.monotonic() < deadline and self.proc.poll() is None, "".join(self.output)
                time.sleep(0.1)
        pid = self.proc.pid
        self.children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        assert len(self.children) == 2, self.children

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.children:  # a worker its parent left behind (the bug) is killed here
            with contextlib.suppress(OSError):  # gone already
                if b"harnessrl" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def start_workers(tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    """``start_workers(name, port=0, extra=())``: a started gateway, stopped (and its workers killed) at the end."""
    started: list[Workers] = []

    def start(name: str, port: int = 0, extra: Sequence[str] = ()) -> Workers:
        workers = Workers(tmp_path, name, port, extra)
        started.append(workers)
        return workers

    yield start
    for workers in reversed(started):
        workers.stop()


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended (a zombie nobody reaped yet counts: it serves nothing)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rpartition(")")[2].split()[0] in ("Z", "X")


def test_workers_end_when_their_parent_is_killed(start_workers: Callable[..., Workers]) -> None:
    """SIGKILL of the parent (the OOM killer, ``kill -9``, a supervisor giving up) left both workers
    serving the port forever, orphaned: no one to stop them, and a gateway restarted on that port
    (SO_REUSEPORT) shared its connections with them. Each worker now gets SIGTERM when its parent
    dies and stops as on any SIGTERM."""
    gateway = start_workers("a")
    assert gateway.wait_listening() is not None, "".join(gateway.output)
    gateway.wait_serving()
    gateway.proc.kill()
    gateway.proc.wait()
    deadline = time.monotonic() + 60
    while not all(_gone(pid) for pid in gateway.children):
        assert time.monotonic() < deadline, f"workers {gateway.children} outlived their parent"
        time.sleep(0.1)


def test_a_second_workers_gateway_on_the_same_port_is_refused(start_workers: Callable[..., Workers]) -> None:
    """Workers listen with SO_REUSEPORT, which any process of the same user may join: a second
    ``--workers`` gateway on a port in use (another run's, a restart while the old one still runs)
    started without a word and the kernel spread the port's connections over both (other store,
    other gate: calls refused with 401, a pause reaching half the processes). It is now refused
    (exit 1 naming gateway.port, as a port taken by anything else) and the first one keeps the port alone."""
    first = start_workers("a")
    url = first.wait_listening()
    assert url is not None, "".join(first.output)
    first.wait_serving()
    port = int(url.rsplit(":", 1)[1])
    second = start_workers("b", port)
    assert second.wait_listening() is None, "a second gateway listens on the same port"
    assert second.proc.returncode == 1, "".join(second.output)  # as a port in use by anything else
    assert "gateway.port" in "".join(second.output) and str(port) in "".join(second.output)
    with GatewayClient(url, ADMIN_KEY) as client:
        ids = {row["gateway_id"] for row in client.state()["gateways"]}
        for _ in range(8):  # fresh connections: the kernel may hand each to any process on the port
            with GatewayClient(url, ADMIN_KEY) as fresh:
                assert fresh.state()["gateway_id"] in ids


@pytest.mark.parametrize(
    ("args", "admin_key", "named"),
    [
        (["--workers", "0"], ADMIN_KEY, "gateway.workers"),
        (["--workers", "2", "--port", "99999"], ADMIN_KEY, "gateway.port"),
        (["--workers", "2"], "key with spaces", "gateway.admin_key"),
        (["--model", "vllm:"], ADMIN_KEY, "engine.model"),
    ],
)
def test_python_m_gateway_names_a_bad_setting(
    tmp_path: Path, args: list[str], admin_key: str, named: str
) -> None:
    """``python -m harnessrl.gateway`` built its settings with pydantic directly: ``--workers 0``,
    a port out of range, an admin key HTTP cannot carry (printed whole in the traceback) or a
    ``vllm:`` model without a URL was a ValidationError traceback (exit 1).
    Now the error names the setting (exit 2), as ``harnessrl gateway`` does."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["Hello there."]))
    done = subprocess.run(
        [sys.executable, "-m", "harnessrl.gateway", "--model", f"scripted:{script}", *args],
        cwd=tmp_path,
        env={**os.environ, "HARNESSRL_ADMIN_KEY": admin_key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert admin_key not in done.stderr  # the key itself is never printed


def _serving(start_workers: Callable[..., Workers], *extra: str) -> Workers:
    gateway = start_workers("a", extra=extra)
    assert gateway.wait_listening() is not None, "".join(gateway.output)
    gateway.wait_serving()
    assert len(gateway.controls) == 2, gateway.output[:1]
    return gateway


def _sample_values(text: str, name: str) -> dict[str, float]:
    """``name``'s samples in a Prometheus exposition: {its labels as written: value}."""
    values = {}
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            labels, _, value = line.rpartition(" ")
            values[labels[len(name) :]] = float(value)
    return values


def test_a_resume_is_answered_once_every_worker_applied_it(start_workers: Callable[..., Workers]) -> None:
    """The resume was answered as soon as it was committed; the other worker opened on its next look
    at the store (SQLite: up to 50 ms later). A trainer that resumed and then read the gateway found
    a worker still paused (``/api/health`` on it, its row in ``/api/state``), and one of its calls
    still held. Now the resume waits for every live worker's ack, and says so (``applied``)."""
    gateway = _serving(start_workers)
    assert gateway.url is not None
    # Connections opened beforehand: the reads follow the resume at once, as a trainer's would.
    with GatewayClient(gateway.url, ADMIN_KEY) as client, httpx.Client(timeout=30) as each:
        for url in gateway.controls:
            each.get(f"{url}/api/health")
        for _ in range(5):
            assert client.pause(timeout=30)["drained"] is True
            resumed = client.resume()
            states = [each.get(f"{url}/api/health").json()["paused"] for url in gateway.controls]
            assert states == [False, False], f"a worker still paused after the resume: {states}"
            rows = client.state()["gateways"]
            assert len(rows) == 2 and all(
                r["command"] >= resumed["command"] and not r["paused"] for r in rows
            )
            assert resumed["applied"] is True and len(resumed["gateways"]) == 2


def test_metrics_on_the_public_address_are_every_workers(start_workers: Callable[..., Workers]) -> None:
    """``/metrics`` on the public address was answered by whichever worker the kernel picked, so
    ``harnessrl_calls_total`` jumped between the two workers' counts from one scrape to the next.
    Now each scrape holds every worker's series (label ``worker``), summing to every call made."""
    gateway = _serving(start_workers)
    assert gateway.url is not None
    with GatewayClient(gateway.url, ADMIN_KEY) as client:
        rollout = client.create_rollout({})
    calls = 8
    for _ in range(calls):  # a fresh connection per call: the kernel hands each to either worker
        sdk = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
        sdk.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}])
        sdk.close()
    for _ in range(6):  # fresh connections again: any worker may take the scrape
        with GatewayClient(gateway.url, ADMIN_KEY) as fresh:
            text = fresh.metrics()
        assert _sample_values(text, "harnessrl_worker_up") == {'{worker="0"}': 1.0, '{worker="1"}': 1.0}
        assert sum(_sample_values(text, "harnessrl_calls_total").values()) == calls, text
    # The caller's credentials are checked as on any worker: no key, no metrics.
    assert httpx.get(f"{gateway.url}/metrics", timeout=30).status_code == 401
    # Each control socket still answers for its own worker alone.
    own = [
        _sample_values(httpx.get(f"{u}/metrics", headers=ADMIN, timeout=30).text, "harnessrl_calls_total")
        for u in gateway.controls
    ]
    assert sum(sum(v.values()) for v in own) == calls
    assert all("worker" not in labels for v in own for labels in v)


def test_the_per_key_cap_holds_across_workers(start_workers: Callable[..., Workers]) -> None:
    """``gateway.max_requests_per_key`` was counted in each worker process: the kernel spreads a
    key's connections over the workers, so with 2 workers a key had up to twice the cap in flight.
    Here the cap is 1 and the gateway paused, so every call admitted stays in flight: 10 calls of one
    key, each on a fresh connection, are 1 held and 9 answered 429, whichever workers took them."""
    gateway = _serving(start_workers, "--set", "gateway.max_requests_per_key=1")
    assert gateway.url is not None
    client = GatewayClient(gateway.url, ADMIN_KEY)
    rollout = client.create_rollout({})
    client.pause(timeout=30)
    statuses: list[int] = []

    def call() -> None:
        with httpx.Client(timeout=120) as http:
            answer = http.post(
                f"{gateway.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {rollout['api_key']}"},
                json={"model": "p", "messages": [{"role": "user", "content": "hi"}]},
            )
        statuses.append(answer.status_code)

    def held() -> int:  # calls waiting at the gate, each worker's own count
        return int(
            sum(
                sum(
                    _sample_values(
                        httpx.get(f"{u}/metrics", headers=ADMIN, timeout=30).text, "harnessrl_calls_waiting"
                    ).values()
                )
                for u in gateway.controls
            )
        )

    threads = []
    try:
        for sent in range(1, 11):
            threads.append(threading.Thread(target=call))
            threads[-1].start()
            deadline = time.monotonic() + 60
            while len(statuses) + held() < sent:  # this call was answered or is held
                assert time.monotonic() < deadline, "a call neither answered nor held"
                time.sleep(0.02)
        assert held() == 1 and sorted(statuses) == [429] * 9, (held(), statuses)
    finally:
        client.resume()
        for thread in threads:
            thread.join(timeout=60)
        client.close()
    assert sorted(statuses) == [200] + [429] * 9
