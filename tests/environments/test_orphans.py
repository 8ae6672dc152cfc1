"""What a process killed outright (SIGKILL, OOM) leaves of its image builds: its ``podman build`` (with
the ``RUN`` steps it started in sessions of their own) or ``mmdebstrap`` runs on, re-parented, and its
scratch folders stay under ``<store>/tmp``. The next build of the store, or ``harnessrl images
prune``, kills and removes them; a live process's build is left alone.

No image is built: ``HARNESSRL_PODMAN`` and ``mmdebstrap`` are shell scripts whose build starts a
"step" in a session of its own (as runc does) and then runs on until killed. Every wait is for a
state, with a timeout that only ends a hung test.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fakes.processes import WAIT_S, processes_running, wait_for

from harnessrl.environments.store import ImageStore

HARNESSRL = [sys.executable, "-m", "harnessrl"]
IMAGE_ID = "a" * 64

FAKE_PODMAN = """#!/bin/sh
case "$1" in
  image)
    case "$2" in
      exists) case "$3" in *harnessrl*) [ -e "$FAKE_DIR/built" ]; exit $? ;; *) exit 0 ;; esac ;;
      inspect) echo '[{"Id": "FAKE_ID"}]' ;;
      *) echo '[]' ;;
    esac ;;
  build)
    if [ -e "$FAKE_DIR/hang" ]; then
      setsid sh -c "while :; do sleep 1; done # step-$FAKE_MARK" </dev/null >/dev/null 2>&1 &
      echo started
      exec sh -c "while :; do sleep 1; done # client-$FAKE_MARK"
    fi
    touch "$FAKE_DIR/built"; echo built ;;
  *) echo '[]' ;;
esac
""".replace("FAKE_ID", IMAGE_ID)

FAKE_MMDEBSTRAP = """#!/bin/sh
setsid sh -c "while :; do sleep 1; done # apt-$FAKE_MARK" </dev/null >/dev/null 2>&1 &
echo started
exec sh -c "while :; do sleep 1; done # mmdebstrap-$FAKE_MARK"
"""


FAKE_PULLING_PODMAN = """#!/bin/sh
case "$1 $2" in
  "image exists") [ -e "$FAKE_DIR/pulled-$(echo "$3" | tr / _)" ]; exit $? ;;
  "image inspect") echo '[{"Id": "FAKE_ID"}]' ;;
  pull*)
    case "$2" in *_first*)
      echo started > "$FAKE_DIR/pulling"
      exec sh -c "while :; do sleep 1; done # pull-$FAKE_MARK" ;;
    esac
    touch "$FAKE_DIR/pulled-$(echo "$2" | tr / _)" ;;
  *) echo '[]' ;;
esac
""".replace("FAKE_ID", IMAGE_ID)


class Fakes:
    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "fake"
        self.dir.mkdir()
        self.mark = secrets.token_hex(6)
        self.store = tmp_path / "store"
        self.podman = self.dir / "podman"
        self.podman.write_text(FAKE_PODMAN)
        self.podman.chmod(0o755)
        (self.dir / "mmdebstrap").write_text(FAKE_MMDEBSTRAP)
        (self.dir / "mmdebstrap").chmod(0o755)
        context = tmp_path / "ctx"
        context.mkdir()
        (context / "Containerfile").write_text("FROM localhost/base:1\nRUN true\n")
        self.containerfile = context / "Containerfile"
        self.env = {
            **os.environ,
            "HARNESSRL_PODMAN": str(self.podman),
            "FAKE_DIR": str(self.dir),
            "FAKE_MARK": self.mark,
            "PATH": f"{self.dir}:{os.environ['PATH']}",
        }
        self.started: list[subprocess.Popen[str]] = []

    def hang(self, on: bool) -> None:
        (self.dir / "hang").touch() if on else (self.dir / "hang").unlink()

    def ensure(self, recipe: str, *, then: str = "", pull: bool = False) -> subprocess.Popen[str]:
        """A real process that builds ``recipe`` (an ``ImageRecipe(...)`` expression) in the store
        (``then``: a script that replaces the plain call, with ``build()`` making the call)."""
        script = (
            "from harnessrl.environments.config import ImageRecipe\n"
            "from harnessrl.environments.store import ImageStore\n"
            f"store = ImageStore({str(self.store)!r}, ca_bundle=None, pull={pull})\n"
            f"def build():\n    return store.ensure('spin', {recipe})\n"
            + (then or "print(build().reference)\n")
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(process)
        return process

    def containerfile_recipe(self) -> str:
        return f"ImageRecipe(containerfile={str(self.containerfile)!r})"

    def scratch(self) -> list[str]:
        tmp = self.store / "tmp"
        return sorted(p.name.split("-")[0] for p in tmp.iterdir()) if tmp.is_dir() else []

    def log_says_started(self) -> bool:
        return any("started" in log.read_text() for log in (self.store / "logs").glob("*.log"))

    def building(self, parent: subprocess.Popen[str]) -> bool:
        """Whether ``parent``'s tool runs with its step (both carry the mark); an error if it ended."""
        if parent.poll() is not None:
            raise AssertionError(f"the building process ended: {parent.communicate()[1][-2000:]}")
        return self.log_says_started() and len(processes_running(self.mark)) >= 2


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[Fakes]:
    made = Fakes(tmp_path)
    try:
        yield made
    finally:
        for process in made.started:
            process.kill()
            process.wait()
        for pid in processes_running(made.mark):  # the old behaviour: never leave a spinning process
            os.kill(pid, signal.SIGKILL)


def kill_while_building(fakes: Fakes, recipe: str) -> None:
    """Start a build in a real process, SIGKILL it once its tool runs, and check (the control) that
    the tool and its step live on, re-parented, with the process's scratch."""
    fakes.hang(True)
    parent = fakes.ensure(recipe)
    wait_for("the build and its step to start", lambda: fakes.building(parent))
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert len(processes_running(fakes.mark)) >= 2  # the tool and its step outlived their parent
    assert fakes.scratch() != []


def test_a_killed_processs_build_is_reaped_by_the_next_build(fakes: Fakes):
    kill_while_building(fakes, fakes.containerfile_recipe())
    assert sorted(fakes.scratch()) == ["build", "recipe"]
    fakes.hang(False)
    second = fakes.ensure(fakes.containerfile_recipe())
    out, err = second.communicate(timeout=WAIT_S)
    assert second.returncode == 0, err[-2000:]
    assert out.strip().startswith("localhost/harnessrl/spin:")
    wait_for("the orphaned build to be gone", lambda: processes_running(fakes.mark) == [])
    assert fakes.scratch() == []


def test_a_killed_processs_build_is_reaped_by_images_prune(fakes: Fakes):
    kill_while_building(fakes, fakes.containerfile_recipe())
    done = subprocess.run(
        [*HARNESSRL, "images", "prune", "--store", str(fakes.store)],
        env=fakes.env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    wait_for("the orphaned build to be gone", lambda: processes_running(fakes.mark) == [])
    assert fakes.scratch() == []


def test_a_killed_processs_mmdebstrap_is_reaped_by_the_next_start(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
):
    kill_while_building(fakes, "ImageRecipe(debian={'suite': 'bookworm'})")
    monkeypatch.setenv("HARNESSRL_PODMAN", str(fakes.podman))
    ImageStore(fakes.store, ca_bundle=None).prune()
    wait_for("the orphaned mmdebstrap to be gone", lambda: processes_running(fakes.mark) == [])
    assert fakes.scratch() == []


@pytest.mark.parametrize(
    ("kind", "thread"),
    [("containerfile", "executor"), ("containerfile", "thread"), ("debian", "executor")],
)
def test_a_build_in_a_worker_thread_ends_when_the_main_thread_does(fakes: Fakes, kind: str, thread: str):
    # The trainer builds in asyncio.to_thread (a ThreadPoolExecutor's thread): once its main thread
    # ends (Ctrl-C reaching the top, an error), the interpreter waits for that thread before it
    # exits, and the thread for its command, which (a build) could take 30 min.
    recipe = fakes.containerfile_recipe() if kind == "containerfile" else "ImageRecipe(debian={'suite': 'x'})"
    start = {
        "executor": "from concurrent.futures import ThreadPoolExecutor\nThreadPoolExecutor().submit(build)\n",
        "thread": "threading.Thread(target=build).start()\n",  # not a daemon: the interpreter waits
    }[thread]
    fakes.hang(True)
    main = (
        "import threading\n"
        "from pathlib import Path\n" + start + f"logs = Path({str(fakes.store / 'logs')!r})\n"
        "while not any('started' in log.read_text() for log in logs.glob('*.log')):\n"
        "    threading.Event().wait(0.1)\n"
        "raise SystemExit(3)\n"  # the main thread ends while the build runs
    )
    parent = fakes.ensure(recipe, then=main)
    wait_for("the process to exit", lambda: parent.poll() is not None)
    assert parent.returncode == 3, parent.stderr.read() if parent.stderr else ""
    assert processes_running(fakes.mark) == []
    assert fakes.scratch() == []


def test_pulls_of_two_images_whose_names_start_alike_do_not_wait_for_each_other(fakes: Fakes):
    # Each pull holds a lock per image; the lock was named by the reference's first 32 characters,
    # which every SWE-smith image shares ("docker.io/jyangballin/swesmith.x86_64.<repo>").
    fakes.podman.write_text(FAKE_PULLING_PODMAN)
    fakes.store.mkdir()
    prefix = "docker.io/someone/swesmith.x86_64.repository_"
    slow = fakes.ensure(f"ImageRecipe(image={prefix + 'first:1'!r})", then="build()\n", pull=True)
    wait_for("the first pull to start", lambda: (fakes.dir / "pulling").exists())
    fast = fakes.ensure(
        f"ImageRecipe(image={prefix + 'second:1'!r})", then="print(build().image_id)\n", pull=True
    )
    try:
        out, err = fast.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError("the second pull waited for the first one") from None
    assert fast.returncode == 0, err[-2000:]
    assert out.strip() == IMAGE_ID
    assert slow.poll() is None  # the first pull still runs: the second did not wait for it


def test_a_live_processs_build_is_left_alone(fakes: Fakes, monkeypatch: pytest.MonkeyPatch):
    fakes.hang(True)
    parent = fakes.ensure(fakes.containerfile_recipe())
    wait_for("the build and its step to start", lambda: fakes.building(parent))
    running = processes_running(fakes.mark)
    monkeypatch.setenv("HARNESSRL_PODMAN", str(fakes.podman))
    ImageStore(fakes.store, ca_bundle=None).prune()  # another process's start: its owner lives
    assert parent.poll() is None
    # Each one still runs (a fake step's loop forks ``sleep``: a passing fork may be listed too).
    assert set(running) <= set(processes_running(fakes.mark))
    assert sorted(fakes.scratch()) == ["build", "recipe"]


def test_a_stale_scratch_folder_is_removed_without_entering_a_mount_in_it(tmp_path: Path):
    from harnessrl.environments.processes import owner, remove_scratch, stale_scratch

    gone = subprocess.run(
        [sys.executable, "-c", "from harnessrl.environments.processes import owner; print(owner())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    scratch = tmp_path / "store" / "tmp" / f"build-{gone}-x"
    (scratch / "bundle" / "rootfs").mkdir(parents=True)
    (scratch / "file").write_text("scratch")
    live = tmp_path / "store" / "tmp" / f"build-{owner()}-y"
    live.mkdir()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious").write_text("not the scratch's")
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "--bind", str(kept), str(scratch / "bundle" / "rootfs")], check=True)
    try:
        stale = stale_scratch(tmp_path / "store" / "tmp")
        assert stale == [scratch]  # the live process's folder is not stale
        remove_scratch(scratch)
        assert (kept / "precious").read_text() == "not the scratch's"
        assert not (scratch / "file").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(scratch / "bundle" / "rootfs")], check=False)
    remove_scratch(scratch)
    assert not scratch.exists() and live.is_dir()
