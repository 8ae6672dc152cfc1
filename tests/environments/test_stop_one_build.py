"""Stopping one piece of work's image build, and only it (``processes.BuildStop``, which
``stopping.in_thread_stoppably`` gives each call): two builds of one process, one cancelled, the other
builds on and succeeds; a wait for another process's build lock, cancelled, ends at once and leaves
that process's build alone (and, not cancelled, finds the image built once the lock is free).

Cancelling one build used to kill every build of the process (``kill_own_builds``), which failed the
others; and a build waiting on another process's lock (a blocking ``flock``) could not be stopped
until that process's build ended (up to ``build_timeout_s``, 30 min).

No image is built: ``HARNESSRL_PODMAN`` and ``mmdebstrap`` are shell scripts whose build starts a
"step" in a session of its own (as runc does) and runs until the test releases it (a file), each
process marked in its command line with the test's mark and the environment's name. Every wait is
for a state, with a timeout that only ends a hung test.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fakes.processes import WAIT_S, processes_running, wait_for

from harnessrl.environments.config import DebianBase, EnvironmentConfig, ImageRecipe
from harnessrl.environments.resolve import Environments
from harnessrl.environments.stopping import in_thread_stoppably
from harnessrl.environments.store import BuiltImage, ImageStore

IMAGE_ID = "a" * 64

# A build of environment <n> (the name in its -t reference) runs, with its step, until
# $FAKE_DIR/release-<n> exists, then "commits" the image (built-<n>, which `image exists` reads, holding
# the recipe label that `image inspect` reports). The client stays `sh <fake podman> build ... -t
# localhost/harnessrl/<n>:...`, as a real one's argv reads.
FAKE_PODMAN = """#!/bin/sh
name_of() { n="${1##*/}"; echo "${n%%:*}"; }
case "$1" in
  image)
    case "$2" in
      exists)
        case "$3" in
          *harnessrl*) echo "$3" >> "$FAKE_DIR/asked"; [ -e "$FAKE_DIR/built-$(name_of "$3")" ]; exit $? ;;
          *) exit 0 ;;
        esac ;;
      inspect)
        case "$5" in
          *harnessrl*) printf '[{"Id": "FAKE_ID", "Labels": {"io.harnessrl.recipe": "%s"}}]\n' \\
            "$(cat "$FAKE_DIR/built-$(name_of "$5")")" ;;
          *) echo '[{"Id": "FAKE_ID"}]' ;;
        esac ;;
      *) echo '[]' ;;
    esac ;;
  build)
    ref=""; prev=""; recipe=""
    for arg in "$@"; do
      [ "$prev" = "-t" ] && ref="$arg"
      [ "$prev" = "--label" ] && case "$arg" in io.harnessrl.recipe=*) recipe="${arg#*=}" ;; esac
      prev="$arg"
    done
    n=$(name_of "$ref")
    echo "$n" >> "$FAKE_DIR/builds"
    setsid sh -c "while [ ! -e '$FAKE_DIR/release-$n' ]; do sleep 0.1; done # step-$FAKE_MARK-$n" \\
      </dev/null >/dev/null 2>&1 &
    echo started
    while [ ! -e "$FAKE_DIR/release-$n" ]; do sleep 0.1; done
    echo "$recipe" > "$FAKE_DIR/built-$n" ;;
  *) echo '[]' ;;
esac
""".replace("FAKE_ID", IMAGE_ID)

# mmdebstrap runs (its client `sh <fake mmdebstrap> ...`, with an "apt" in a session of its own) until killed.
FAKE_MMDEBSTRAP = """#!/bin/sh
setsid sh -c "while :; do sleep 1; done # apt-$FAKE_MARK-debian" </dev/null >/dev/null 2>&1 &
while :; do sleep 1; done
"""


class Fakes:
    """The fake tools in ``tmp_path``, a store, and a Containerfile per environment name."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.dir = tmp_path / "fake"
        self.dir.mkdir()
        self.mark = secrets.token_hex(6)
        self.store_path = tmp_path / "store"
        self.podman = self.dir / "podman"
        self.podman.write_text(FAKE_PODMAN)
        self.podman.chmod(0o755)
        (self.dir / "mmdebstrap").write_text(FAKE_MMDEBSTRAP)
        (self.dir / "mmdebstrap").chmod(0o755)
        self.env = {
            "HARNESSRL_PODMAN": str(self.podman),
            "FAKE_DIR": str(self.dir),
            "FAKE_MARK": self.mark,
            "PATH": f"{self.dir}:{os.environ['PATH']}",
        }
        self.started: list[subprocess.Popen[str]] = []

    def recipe(self, name: str) -> ImageRecipe:
        context = self.tmp / f"ctx-{name}"
        context.mkdir(exist_ok=True)
        (context / "Containerfile").write_text(f"FROM localhost/base:1\nRUN echo {name}\n")
        return ImageRecipe(containerfile=str(context / "Containerfile"))

    def store(self) -> ImageStore:
        return ImageStore(self.store_path, ca_bundle=None)

    def running(self, name: str) -> list[int]:
        """The live processes of ``name``'s build: its client (the fake's path and the image's name in
        its argv) and its step (the mark and the name)."""
        found = processes_running(f"-{self.mark}-{name}")
        if name == "debian":
            return found + processes_running(str(self.dir / "mmdebstrap"))
        for pid in processes_running(str(self.podman)):
            with contextlib.suppress(OSError):
                if f"/harnessrl/{name}:".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        return found

    def building(self, name: str) -> bool:
        return len(self.running(name)) >= 2

    def release(self, name: str) -> None:
        (self.dir / f"release-{name}").touch()

    def builds(self) -> list[str]:
        """The environments a build was started for, in order."""
        path = self.dir / "builds"
        return path.read_text().split() if path.exists() else []

    def asked(self) -> int:
        """How many ``podman image exists`` of an own image were answered."""
        path = self.dir / "asked"
        return len(path.read_text().split()) if path.exists() else 0

    def scratch(self) -> list[str]:
        tmp = self.store_path / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.is_dir() else []

    def ensure_elsewhere(self, name: str) -> subprocess.Popen[str]:
        """Another real process that ensures ``name``'s image in the store (and so holds its lock)."""
        context = self.tmp / f"ctx-{name}" / "Containerfile"
        script = (
            "from harnessrl.environments.config import ImageRecipe\n"
            "from harnessrl.environments.store import ImageStore\n"
            f"store = ImageStore({str(self.store_path)!r}, ca_bundle=None)\n"
            f"print(store.ensure({name!r}, ImageRecipe(containerfile={str(context)!r})))\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            env={**os.environ, **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fakes]:
    made = Fakes(tmp_path)
    for key, value in made.env.items():
        monkeypatch.setenv(key, value)
    try:
        yield made
    finally:
        for name in ("one", "two"):
            made.release(name)
        for process in made.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=WAIT_S)
            if process.poll() is None:
                process.kill()
                process.wait()
        for pid in processes_running(made.mark, str(made.dir)):  # never leave a spinning process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def wait_until(what: str, ready, timeout_s: float = WAIT_S) -> None:
    """``wait_for`` for a coroutine: polls ``ready()`` without blocking the event loop."""
    for _ in range(int(timeout_s * 10)):
        if ready():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


def test_cancelling_one_build_kills_it_and_the_other_build_goes_on(fakes: Fakes):
    store = fakes.store()
    one, two = fakes.recipe("one"), fakes.recipe("two")

    async def go() -> BuiltImage:
        first = asyncio.create_task(in_thread_stoppably(store.ensure, "one", one))
        second = asyncio.create_task(in_thread_stoppably(store.ensure, "two", two))
        try:
            await wait_until("both builds to run", lambda: fakes.building("one") and fakes.building("two"))
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            # The cancelled call's thread has ended: its build is killed with its step, now.
            wait_for("the cancelled build's processes to be gone", lambda: fakes.running("one") == [])
            # The control: the other build (same process, same store) runs on, untouched.
            assert fakes.building("two") and not second.done()
            fakes.release("two")
            return await second
        finally:
            fakes.release("one")
            fakes.release("two")
            await asyncio.gather(first, second, return_exceptions=True)

    built = asyncio.run(go())
    assert built.built and built.reference.startswith("localhost/harnessrl/two:")
    assert not (fakes.dir / "built-one").exists()  # the killed build committed nothing
    assert sorted(fakes.builds()) == ["one", "two"]
    # The released step (a session of its own, as runc's) notices its release up to 0.1 s after the
    # client does: wait for it rather than race it.
    wait_for("the finished build's step to end", lambda: fakes.running("two") == [])
    assert fakes.scratch() == []


def test_a_wait_for_another_processs_build_lock_stops_at_once_and_leaves_that_build_alone(fakes: Fakes):
    recipe = fakes.recipe("one")
    holder = fakes.ensure_elsewhere("one")
    wait_for("the other process's build to run", lambda: fakes.building("one"))
    assert holder.poll() is None
    store = fakes.store()

    async def go() -> None:
        waiter = asyncio.create_task(in_thread_stoppably(store.ensure, "one", recipe))
        try:
            # "Is it built?" asked by the holder (before and under its lock), then by the waiter: at the lock.
            await wait_until("the waiter to reach the build lock", lambda: fakes.asked() >= 3)
            assert not waiter.done()
            waiter.cancel()
            done, _ = await asyncio.wait({waiter}, timeout=WAIT_S)
            assert waiter in done, "the cancelled wait for the lock did not end"
            assert waiter.cancelled()
            # The holder's build and its step run on, its lock still held.
            assert fakes.building("one") and holder.poll() is None
            assert fakes.builds() == ["one"]
        finally:
            fakes.release("one")  # the old behaviour: the waiter waited for the holder's build
            await asyncio.gather(waiter, return_exceptions=True)

    asyncio.run(go())
    out, err = holder.communicate(timeout=WAIT_S)
    assert holder.returncode == 0, err[-2000:]
    assert "built=True" in out
    assert fakes.builds() == ["one"]  # built once, by the holder


def test_a_waiter_not_stopped_finds_the_image_the_lock_holder_built(fakes: Fakes):
    # The control for the two above: the same wait, not cancelled, ends once the holder's build does,
    # and finds the image built (one builder per digest: it builds nothing itself).
    recipe = fakes.recipe("one")
    holder = fakes.ensure_elsewhere("one")
    wait_for("the other process's build to run", lambda: fakes.building("one"))
    store = fakes.store()

    async def go() -> BuiltImage:
        waiter = asyncio.create_task(in_thread_stoppably(store.ensure, "one", recipe))
        try:
            await wait_until("the waiter to reach the build lock", lambda: fakes.asked() >= 3)
            assert not waiter.done()
            fakes.release("one")
            return await waiter
        finally:
            fakes.release("one")
            await asyncio.gather(waiter, return_exceptions=True)

    built = asyncio.run(go())
    assert not built.built and built.reference.startswith("localhost/harnessrl/one:")
    holder.communicate(timeout=WAIT_S)
    assert holder.returncode == 0
    assert fakes.builds() == ["one"]


def test_cancelling_a_debian_base_kills_its_mmdebstrap_only(fakes: Fakes):
    store = fakes.store()
    debian = ImageRecipe(debian=DebianBase())
    two = fakes.recipe("two")

    async def go() -> BuiltImage:
        base = asyncio.create_task(in_thread_stoppably(store.ensure, "deb", debian))
        other = asyncio.create_task(in_thread_stoppably(store.ensure, "two", two))
        try:
            await wait_until(
                "mmdebstrap and the other build to run",
                lambda: fakes.building("debian") and fakes.building("two"),
            )
            base.cancel()
            with pytest.raises(asyncio.CancelledError):
                await base
            wait_for("mmdebstrap and its apt to be gone", lambda: fakes.running("debian") == [])
            assert fakes.building("two") and not other.done()
            fakes.release("two")
            return await other
        finally:
            fakes.release("two")
            for pid in fakes.running("debian"):  # the old behaviour: mmdebstrap left running
                os.kill(pid, signal.SIGKILL)
            await asyncio.gather(base, other, return_exceptions=True)

    built = asyncio.run(go())
    assert built.built and built.reference.startswith("localhost/harnessrl/two:")
    assert fakes.scratch() == []  # the debian base's scratch (its tar's folder) removed too


def test_a_rollout_waiting_for_its_own_processs_build_of_the_image_stops_and_the_build_goes_on(fakes: Fakes):
    """Two rollouts of one controller need the same image: the second waits at ``Environments``'
    per-name lock while the first builds. Cancelled, it waited for that whole build (a plain
    ``threading.Lock``); now it ends at once, and the first one's build goes on and is the image."""
    environments = Environments(EnvironmentConfig(images={"one": fakes.recipe("one")}), store=fakes.store())

    async def go() -> BuiltImage:
        first = asyncio.create_task(
            in_thread_stoppably(functools.partial(environments.built, "one", where="first"))
        )
        await wait_until("the first build to run", lambda: fakes.building("one"))
        second = asyncio.create_task(
            in_thread_stoppably(functools.partial(environments.built, "one", where="second"))
        )
        try:
            await asyncio.sleep(0.5)  # a head start at the lock; the test holds either way
            second.cancel()
            done, _ = await asyncio.wait({second}, timeout=WAIT_S)
            assert second in done, "the cancelled wait for this process's build did not end"
            assert second.cancelled()
            assert fakes.building("one") and not first.done()  # the build it waited on runs on
            fakes.release("one")
            return await first
        finally:
            fakes.release("one")
            await asyncio.gather(first, second, return_exceptions=True)

    built = asyncio.run(go())
    assert built.built and fakes.builds() == ["one"]


def test_control_a_rollout_waiting_for_its_own_processs_build_gets_that_image(fakes: Fakes):
    environments = Environments(EnvironmentConfig(images={"one": fakes.recipe("one")}), store=fakes.store())

    async def go() -> tuple[BuiltImage, BuiltImage]:
        first = asyncio.create_task(
            in_thread_stoppably(functools.partial(environments.built, "one", where="first"))
        )
        await wait_until("the first build to run", lambda: fakes.building("one"))
        second = asyncio.create_task(
            in_thread_stoppably(functools.partial(environments.built, "one", where="second"))
        )
        try:
            await asyncio.sleep(0.5)
            assert not second.done()  # waiting at the lock
            fakes.release("one")
            return await first, await second
        finally:
            fakes.release("one")
            await asyncio.gather(first, second, return_exceptions=True)

    a, b = asyncio.run(go())
    assert a == b and fakes.builds() == ["one"]  # built once, for both
