"""A harnessrl process killed outright together with its ``podman build`` (SIGKILL of the whole
cgroup, the OOM killer) leaves the build's working container, mounted, with no process left to name
its layer; ``Podman.reap_orphans`` (the next build of the store, ``images prune``) removes it by the
build's mark (``BUILD_MARK``: its owner is gone). A live process's build is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.environments.image_support import TINY, HeldDownload, held, needs_podman, tiny_store
from tests.environments.test_store import recipe
from tests.fakes.processes import WAIT_S, processes_running, wait_for

from harnessrl.environments.store import ImageStore

__all__ = ["held", "tiny_store"]  # the fixtures, imported to be used here


def build_in_a_process(store: ImageStore, containerfile: str) -> subprocess.Popen[str]:
    script = (
        "from harnessrl.environments.config import ImageRecipe\n"
        "from harnessrl.environments.store import ImageStore\n"
        f"store = ImageStore({str(store.folder)!r}, ca_bundle=None)\n"
        f"store.ensure('held', ImageRecipe(containerfile={containerfile!r}))\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)


def held_build_in_a_process(store: ImageStore, context: Path, held: HeldDownload) -> subprocess.Popen[str]:
    """A build in a child process, held at its ``ADD`` of ``held``'s file (its working container made)."""
    env = recipe(context, f'FROM {TINY}\nADD {held.url} /file\nRUN ["/usr/bin/cat", "/file"]\n')
    assert env.containerfile is not None
    building = build_in_a_process(store, env.containerfile)
    wait_for("the ADD step's download", held.asked.is_set)
    return building


def podman_of(building: subprocess.Popen[str], context: Path) -> int:
    """The ``podman build`` the process ``building`` started (its command line names the context)."""
    (client,) = [p for p in processes_running(str(context)) if p not in (os.getpid(), building.pid)]
    return client


@needs_podman
def test_a_build_killed_with_its_process_leaves_no_working_container(
    tiny_store: ImageStore, tmp_path: Path, held: HeldDownload
):
    building = held_build_in_a_process(tiny_store, tmp_path / "ctx", held)
    try:
        client = podman_of(building, tmp_path / "ctx")
        building.kill()  # harnessrl first: alive, it would clean up after its podman
        building.wait()
        os.kill(client, signal.SIGKILL)  # then its podman, as a cgroup kill takes both
        wait_for("the podman build to end", lambda: client not in processes_running(str(tmp_path / "ctx")))
        assert list(tiny_store.podman._build_marks()) != []  # the control: the working container stays
        tiny_store.podman.reap_orphans()
        assert tiny_store.podman._build_marks() == {}  # was: the working container, mounted, for good
    finally:
        building.kill()
        building.wait()


@needs_podman
def test_a_live_processs_build_keeps_its_working_container(
    tiny_store: ImageStore, tmp_path: Path, held: HeldDownload
):
    building = held_build_in_a_process(tiny_store, tmp_path / "ctx", held)
    try:
        before = tiny_store.podman._build_marks()
        assert before != {}
        tiny_store.podman.reap_orphans()  # another process's reaping: this build's owner lives
        assert tiny_store.podman._build_marks() == before
        held.answer.set()
        _, err = building.communicate(timeout=WAIT_S)
        assert building.returncode == 0, err  # the build went on to its image
        assert tiny_store.podman._build_marks() == {}
    finally:
        building.kill()
        building.wait()
