"""What the tests that need real container images share: the example's environments, one attack image,
and a skip reason when images cannot be built or run here.

Every image is built through harnessrl's own image store (``HARNESSRL_CACHE_DIR/containers``, which
``tests/conftest.py`` points into the checkout) and cached by its recipe's content, so the Debian base
(``examples/swe/train.toml``'s ``swe-base``, ~3 min with a cold apt download) is made once per
machine and every later session, and every xdist worker, finds it (builds take a lock per recipe).
Images a test makes for itself (a recipe with a random token in it) are removed by that test.

``tiny_store`` is the fast path for tests of the image store itself: a private store in the test's
folder holding ``localhost/tiny:1`` (a ~2 MB image of this machine's ``sh`` and ``cat`` and their
libraries, made with ``podman import``: no registry, no Debian mirror), emptied and removed after
the test with every container and mount it made.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fakes.processes import WAIT_S

from harnessrl.environments.config import EnvironmentConfig
from harnessrl.environments.podman import podman_problem
from harnessrl.environments.resolve import Environments
from harnessrl.environments.store import ImageStore
from harnessrl.sandbox.bwrap import sandbox_problem

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "swe"
ATTACK_IMAGE = ROOT / "tests" / "redteam" / "image" / "Containerfile"
ATTACK = "redteam/attack"  # the attack image's environment name


def images_problem() -> str | None:
    if os.geteuid() != 0:
        return "image roots need root here (podman image mount, the sandbox's cgroups)"
    return sandbox_problem() or podman_problem()


needs_images = pytest.mark.skipif(images_problem() is not None, reason=f"no images here: {images_problem()}")


def podman_here_problem() -> str | None:
    if os.geteuid() != 0:
        return "podman image mount and builds need root here"
    return podman_problem()


needs_podman = pytest.mark.skipif(
    podman_here_problem() is not None, reason=f"no podman here: {podman_here_problem()}"
)
TINY = "localhost/tiny:1"


def tiny_tar(dest: Path, programs: tuple[str, ...] = ("/usr/bin/sh", "/usr/bin/cat")) -> Path:
    """A root filesystem of this machine's ``programs`` and the libraries they load, as a tarball."""
    files: dict[str, str] = {}
    for program in programs:
        files[program] = os.path.realpath(program)
        linked = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
        for path in re.findall(r"(/\S+) \(0x", linked):
            files[path] = os.path.realpath(path)
    with tarfile.open(dest, "w") as tar:
        for inside, outside in sorted(files.items()):
            tar.add(outside, arcname=inside.lstrip("/"))
    return dest


def empty_store(store: ImageStore) -> None:
    """Everything a test made in its private store removed: mounts, containers (a build's working
    containers too), images, and the store's folders."""
    podman = store.podman
    for container in json.loads(podman.run("ps", "--all", "--external", "--format", "json").stdout or "[]"):
        podman.run("rm", "--force", container["Id"], check=False)
    podman.run("image", "unmount", "--all", "--force", check=False)
    podman.run("rmi", "--all", "--force", check=False)
    shutil.rmtree(podman.runroot, ignore_errors=True)
    shutil.rmtree(store.folder, ignore_errors=True)


@pytest.fixture
def tiny_store(tmp_path: Path) -> Iterator[ImageStore]:
    """A private image store holding ``localhost/tiny:1`` (see the module docstring)."""
    store = ImageStore(tmp_path / "store", ca_bundle=None, build_timeout_s=300)
    try:
        store.podman.import_tar(tiny_tar(tmp_path / "tiny.tar"), TINY, labels={})
        yield store
    finally:
        empty_store(store)


@functools.cache
def example_environment() -> dict[str, Any]:
    """``[harness.environment]`` of the example's ``train.toml``, paths resolved, plus the attack image."""
    from harnessrl.config import load_raw_config, resolve_relative_paths

    raw = resolve_relative_paths(load_raw_config(str(EXAMPLE / "train.toml"), [], env={}), EXAMPLE)
    section = raw["harness"]["environment"]
    section["images"][ATTACK] = {"containerfile": str(ATTACK_IMAGE)}
    return section


def environments() -> Environments:
    return Environments(EnvironmentConfig.model_validate(example_environment()))


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def environment_toml(section: dict[str, Any] | None = None, **changes: Any) -> str:
    """``section`` (default: the example's, with the attack image) as a ``[harness.environment]``
    TOML table to append to a test's config; ``changes`` override its top-level keys."""
    section = {**(section or example_environment()), **changes}
    lines = ["[harness.environment]"]
    for key, value in section.items():
        if key != "images":
            lines.append(f"{key} = {_toml_value(value)}")
    for name, recipe in section.get("images", {}).items():
        lines.append(f"[harness.environment.images.{json.dumps(name)}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in recipe.items()]
    return "\n".join(lines) + "\n"


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
