"""A harnessrl process killed outright together with its ``podman build`` (SIGKILL of the whole
cgroup, the OOM killer) leaves the build's working container, mounted, with no process left to name
its layer; ``Podman.reap_orphans`` (the next build of the store, ``images prune``) removes it by the
build's mark (``BUILD_MARK``: its owner is gone). A live process's build is left alone."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.environments.image_support import TINY, needs_podman, tiny_store
from tests.environments.test_store import recipe
from tests.fakes.processes import WAIT_S, processes_running, wait_for

from harnessrl.environments.store import ImageStore

__all__ = ["tiny_store"]  # the fixture, imported to be used here


class HeldDownload:
    """A server on 127.0.0.1 whose one file is sent only once ``answer`` is set: a build's ``ADD`` of
    it holds the build at a known step, its working container made (by FROM) and no step running."""

    def __init__(self) -> None:
        self.asked, self.answer = threading.Event(), threading.Event()
        held = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                held.asked.set()
                held.answer.wait(WAIT_S)
                self.send_response(200)
                self.send_header("Content-Length", "1")
                self.end_headers()
                self.wfile.write(b"x")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/file"

    def close(self) -> None:
        self.answer.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def held() -> Iterator[HeldDownload]:
    server = HeldDownload()
    try:
        yield server
    finally:
        server.close()


def build_in_a_process(store: ImageStore, containerfile: str) -> subprocess.Popen[str]:
    script = (
        "from harnessrl.environments.config import ImageRecipe\n"
        "from harnessrl.environments.store import ImageStore\n"
        f"store = ImageStore({str(store.folder)!r}, ca_bundle=None)\n"
        f"store.ensure('held', ImageRecipe(containerfile={containerfile!r}))\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)


def podman_of(building: subprocess.Popen[str], context: Path) -> int:
    """The ``podman build`` the process ``building`` started (its command line names the context)."""
    (client,) = [p for p in processes_running(str(context)) if p not in (os.getpid(), building.pid)]
    return client


@needs_podman
def test_a_build_killed_with_its_process_leaves_no_working_container(
    tiny_store: ImageStore, tmp_path: Path, held: HeldDownload
):
    env = recipe(tmp_path / "ctx", f'FROM {TINY}\nADD {held.url} /file\nRUN ["/usr/bin/cat", "/file"]\n')
    assert env.containerfile is not None
    building = build_in_a_process(tiny_store, env.containerfile)
    try:
        wait_for("the ADD step's download", held.asked.is_set)
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
    env = recipe(tmp_path / "ctx", f'FROM {TINY}\nADD {held.url} /file\nRUN ["/usr/bin/cat", "/file"]\n')
    assert env.containerfile is not None
    building = build_in_a_process(tiny_store, env.containerfile)
    try:
        wait_for("the ADD step's download", held.asked.is_set)
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
