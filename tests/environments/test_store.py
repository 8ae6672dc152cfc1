"""The image store with the real container tool on a tiny image (``image_support.tiny_store``): which
image ``:latest`` names and what prune keeps, bases pinned by id, builds that run too long, short
names, what a recipe's digest covers, mounts given back, and stores the read-only commands must not
create. Each test has a private store, emptied afterwards."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.environments.image_support import (
    TINY,
    HeldDownload,
    empty_store,
    held,
    needs_podman,
    tiny_store,
    tiny_tar,
)
from tests.fakes.processes import processes_running, wait_for

from harnessrl.environments.config import DebianBase, EnvironmentConfig, ImageRecipe
from harnessrl.environments.debian import make_debian_base
from harnessrl.environments.podman import ImageError, Podman
from harnessrl.environments.processes import BuildStop, Stopped, stoppable
from harnessrl.environments.recipes import recipe_digest
from harnessrl.environments.resolve import Environments
from harnessrl.environments.store import LABEL_NAME, LABEL_RECIPE, BuiltImage, ImageStore, own_reference
from harnessrl.sandbox.rootfs import ImageRoot

__all__ = ["held", "tiny_store"]  # the fixtures, imported to be used here
HARNESSRL = [sys.executable, "-m", "harnessrl"]


def recipe(folder: Path, text: str, token: str | None = None) -> ImageRecipe:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token or secrets.token_hex(8))
    (folder / "Containerfile").write_text(text)
    return ImageRecipe(containerfile=str(folder / "Containerfile"))


def latest_id(store: ImageStore, name: str) -> str:
    return store.podman.inspect(f"localhost/harnessrl/{name}:latest")["Id"]


def prune(store: ImageStore, *extra: str) -> dict:
    done = subprocess.run(
        [*HARNESSRL, "images", "prune", "--store", str(store.folder), *extra],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_podman
def test_latest_follows_the_recipe_in_use_and_prune_keeps_it_and_mounted_images(
    tiny_store: ImageStore, tmp_path: Path
):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n", token="v1")
    v1 = tiny_store.ensure("env", env)
    (tmp_path / "ctx" / "token").write_text("v2")
    v2 = tiny_store.ensure("env", env)
    (tmp_path / "ctx" / "token").write_text("v1")  # back to the first recipe: found, not built
    again = tiny_store.ensure("env", env)
    assert not again.built and again.image_id == v1.image_id != v2.image_id
    assert latest_id(tiny_store, "env") == v1.image_id
    # v2 is mounted (a run still uses it): prune's default keeps it, and v1 (:latest).
    tiny_store.root(v2)
    report = prune(tiny_store)
    assert report["removed"] == [] and report["in_use"] == [{"name": "env", "id": v2.image_id[:12]}]
    tiny_store.close()  # given back: now v2 goes
    report = prune(tiny_store)
    assert report["removed"] == [{"name": "env", "id": v2.image_id[:12]}]
    assert {row["id"] for row in tiny_store.list()} == {v1.image_id}


class RetaggingPodman(Podman):
    """Another controller re-tags the base's ``:latest`` between the digest and the build."""

    def __init__(self, store: Path, impostor: str):
        super().__init__(store)
        self.impostor = impostor

    def build(self, containerfile: Path, context: Path, **kwargs) -> None:  # type: ignore[override]
        if any("child" in tag for tag in kwargs["tags"]):
            self.tag(self.impostor, "localhost/harnessrl/base:latest")
        super().build(containerfile, context, **kwargs)


@needs_podman
def test_a_base_retagged_after_the_digest_does_not_go_into_the_image(tiny_store: ImageStore, tmp_path: Path):
    recipes = {
        "base": recipe(tmp_path / "base", f"FROM {TINY}\nCOPY token /base-marker\n"),
        "child": recipe(tmp_path / "child", "FROM localhost/harnessrl/base:latest\nCOPY token /token\n"),
    }
    base = tiny_store.ensure("base", recipes["base"], recipes=recipes)
    tiny_store.podman = RetaggingPodman(tiny_store.folder, impostor=TINY)
    child = tiny_store.ensure("child", recipes["child"], recipes=recipes)
    assert child.built
    root = tiny_store.root(child)
    # The base the digest recorded is in the image, not the impostor tagged meanwhile.
    assert (root.path / "base-marker").read_text() == (tmp_path / "base" / "token").read_text()
    assert base.image_id != tiny_store.podman.inspect(TINY)["Id"]


@needs_podman
def test_a_build_past_its_timeout_leaves_no_process_and_no_container(tiny_store: ImageStore, tmp_path: Path):
    marker = f"spin-{secrets.token_hex(6)}"
    # The step announces itself, then spins; the build waits for the announcement before timing out
    # (a build killed before its RUN step started would prove nothing).
    spin = recipe(
        tmp_path / "ctx",
        f'FROM {TINY}\nRUN ["/usr/bin/sh", "-c", "echo started; while :; do :; done # {marker}"]\n',
    )
    tiny_store.build_timeout_s = 10
    try:
        with pytest.raises(ImageError, match="no answer after 10 s"):
            tiny_store.ensure("spin", spin)
        log = next((tiny_store.folder / "logs").glob("spin-*.log")).read_text()
        assert "started" in log.splitlines()  # the step ran (its output), so there was a process to kill
        assert processes_running(marker) == []
        containers = tiny_store.podman.run("ps", "--all", "--external", "--format", "json").stdout
        assert json.loads(containers or "[]") == []
        assert tiny_store.list() == []
    finally:
        for pid in processes_running(marker):  # the old behaviour: never leave a spinning process
            os.kill(pid, 9)


@needs_podman
def test_a_short_name_never_matches_another_registrys_image(tiny_store: ImageStore, tmp_path: Path):
    tiny_store.podman.import_tar(tiny_tar(tmp_path / "foo.tar"), "quay.io/someone/foo:1", labels={})
    assert tiny_store.podman.exists("quay.io/someone/foo:1")
    assert not tiny_store.podman.exists("foo:1")  # docker.io/library/foo:1, which is not here
    with pytest.raises(ImageError, match="'foo:1' does not exist in the image store"):
        tiny_store.ensure("foo:1", ImageRecipe(image="foo:1"))


@needs_podman
def test_an_image_a_recipe_copies_from_is_part_of_its_digest(tiny_store: ImageStore, tmp_path: Path):
    tiny_store.podman.tag(TINY, "localhost/tool:1")
    env = recipe(tmp_path / "ctx", "FROM scratch\nCOPY --from=localhost/tool:1 /usr/bin/cat /cat\n")
    first = tiny_store.ensure("copier", env)
    # The tool image changes (a new build of it, here one with sh only): the recipe's image too.
    tool = tiny_tar(tmp_path / "tool.tar", programs=("/usr/bin/sh", "/usr/bin/cat", "/usr/bin/ls"))
    tiny_store.podman.import_tar(tool, "localhost/tool:1", labels={})
    second = tiny_store.ensure("copier", env)
    assert second.built and second.digest != first.digest


@needs_podman
def test_from_an_arg_takes_its_default_or_build_arg(tiny_store: ImageStore, tmp_path: Path):
    folder = tmp_path / "ctx"
    env = recipe(folder, "ARG BASE=localhost/nowhere:1\nFROM ${BASE}\nCOPY token /token\n")
    with pytest.raises(ImageError, match="reads the image 'localhost/nowhere:1'"):
        tiny_store.ensure("arg", env)
    with_arg = ImageRecipe(containerfile=env.containerfile, build_args={"BASE": TINY})
    assert tiny_store.ensure("arg", with_arg).built


@needs_podman
def test_a_store_mounts_an_image_once_and_close_gives_it_back(tiny_store: ImageStore, tmp_path: Path):
    built = tiny_store.ensure("env", recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n"))
    barrier = threading.Barrier(4)
    roots = []

    def mount() -> None:
        barrier.wait()
        roots.append(tiny_store.root(built))

    threads = [threading.Thread(target=mount) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({root.path for root in roots}) == 1 and os.path.ismount(roots[0].path)
    tiny_store.close()  # one unmount undoes exactly the one mount made
    assert built.image_id not in tiny_store.podman.mounted_images()
    assert not os.path.ismount(roots[0].path)


@needs_podman
def test_prune_keep_looks_images_up_and_builds_nothing(tiny_store: ImageStore, tmp_path: Path):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n")
    config = tmp_path / "keep.toml"
    config.write_text(
        '[harness]\ncommand = ["true"]\n\n[harness.environment.images.env]\n'
        f"containerfile = {json.dumps(env.containerfile)}\n"
    )
    report = prune(tiny_store, "--keep", str(config))
    assert report["removed"] == [] and tiny_store.list() == []  # env was not built to be kept
    built = tiny_store.ensure("env", env)
    assert prune(tiny_store, "--keep", str(config))["removed"] == []
    assert {row["id"] for row in tiny_store.list()} == {built.image_id}


@needs_podman
def test_images_build_into_a_file_is_one_line_and_status_2(tmp_path: Path):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\n")
    config = tmp_path / "images.toml"
    config.write_text(
        '[harness]\ncommand = ["true"]\n\n[harness.environment.images.env]\n'
        f"containerfile = {json.dumps(env.containerfile)}\n"
    )
    (tmp_path / "a-file").write_text("")
    done = subprocess.run(
        [*HARNESSRL, "images", "build", str(config), "--store", str(tmp_path / "a-file")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"harnessrl: error: --store {str(tmp_path / 'a-file')!r}: not a folder"
    ]


def test_read_only_commands_create_no_store(tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cache = tmp_path / "cache"
    environ = {**os.environ, "HARNESSRL_CACHE_DIR": str(cache)}
    for command in (["list", "--store", str(empty)], ["df", "--store", str(empty)], ["list"], ["df"]):
        done = subprocess.run([*HARNESSRL, "images", *command], capture_output=True, text=True, env=environ)
        assert done.returncode == 0, done.stderr[-2000:]
    assert list(empty.iterdir()) == [] and not cache.exists()


def test_write_conf_under_concurrent_first_use(tmp_path: Path):
    errors = []
    for attempt in range(10):
        podman = Podman(tmp_path / f"store-{attempt}")
        barrier = threading.Barrier(8)

        def first_use(podman: Podman = podman, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                podman.env()
            except OSError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=first_use) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert (tmp_path / "store-0" / "conf" / "storage.conf").is_file()
    assert not [p for p in (tmp_path / "store-0" / "conf").iterdir() if p.suffix == ".tmp"]


@needs_podman
def test_mmdebstrap_reads_the_suite_target_and_mirror_as_positional_arguments(
    tiny_store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A stand-in mmdebstrap (the real one needs a Debian mirror) that records its arguments and fails.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\nexit 1\n')
    (bin_dir / "mmdebstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(ImageError, match="mmdebstrap exited 1"):
        tiny_store.ensure("deb", ImageRecipe(debian={"suite": "bookworm", "mirror": "file:///srv/debian"}))
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-4] == "--" and argv[-3] == "bookworm" and argv[-1] == "file:///srv/debian"


@needs_podman
def test_environments_close_gives_the_run_s_mounts_back(tiny_store: ImageStore, tmp_path: Path):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n")
    config = EnvironmentConfig(images={"env": env})
    environments = Environments(config, store=tiny_store)
    root = environments.root_for({"environment": "env"})
    assert root is not None and environments.root_for({"environment": "env"}) == root
    assert os.path.ismount(root.path)
    environments.close()
    assert not os.path.ismount(root.path) and root.image_id not in tiny_store.podman.mounted_images()


def mounting_process(store: ImageStore, built) -> tuple[subprocess.Popen[str], str]:
    """Another process that mounts ``built`` from ``store``'s folder (as a controller does), says
    where, and then holds the mount until it is killed."""
    script = (
        "import sys\n"
        "from harnessrl.environments.store import BuiltImage, ImageStore\n"
        f"store = ImageStore({str(store.folder)!r}, ca_bundle=None)\n"
        f"root = store.root(BuiltImage('env', {built.reference!r}, {built.image_id!r}, ''))\n"
        "print(root.path, flush=True)\n"
        "sys.stdin.read()\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    path = process.stdout.readline().strip()
    assert path and os.path.ismount(path)
    return process, path


@needs_podman
def test_the_mount_of_a_killed_process_is_given_back_by_the_next_one(tiny_store: ImageStore, tmp_path: Path):
    built = tiny_store.ensure("env", recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n"))
    started: list[subprocess.Popen[str]] = []

    def killed_after_mounting() -> str:
        process, path = mounting_process(tiny_store, built)
        started.append(process)
        process.kill()  # SIGKILL: no close(); podman still counts its mount
        process.wait()
        return path

    try:
        alive, path = mounting_process(tiny_store, built)
        started.append(alive)
        killed_after_mounting()
        tiny_store.root(built)
        tiny_store.close()
        # The live process's mount is untouched (the control); the killed one's was given back.
        assert os.path.ismount(path) and built.image_id in tiny_store.podman.mounted_images()
        alive.kill()
        alive.wait()
        tiny_store.root(built)
        tiny_store.close()
        assert not os.path.ismount(path) and built.image_id not in tiny_store.podman.mounted_images()
        # ... and prune does not report the image in use by a run that is gone.
        killed_after_mounting()
        report = tiny_store.prune(set())
        assert report["in_use"] == [] and [r["id"] for r in report["removed"]] == [built.image_id[:12]]
    finally:
        for process in started:
            process.kill()
            process.wait()


@needs_podman
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_a_process_in_another_pid_namespace_leaves_a_live_processs_mount_alone(
    tiny_store: ImageStore, tmp_path: Path
):
    """Records were judged by pid alone: a process of another PID namespace sharing the store and
    /run (a controller in a container) saw a live process's pid as gone and unmounted its image
    from under its running sandboxes ("bwrap failed to set up the sandbox")."""
    built = tiny_store.ensure("env", recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n"))
    alive, path = mounting_process(tiny_store, built)
    try:
        script = (
            "from harnessrl.environments.store import BuiltImage, ImageStore\n"
            f"store = ImageStore({str(tiny_store.folder)!r}, ca_bundle=None)\n"
            f"store.root(BuiltImage('env', {built.reference!r}, {built.image_id!r}, ''))\n"
            "store.close()\n"
        )
        other = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "--propagation", "unchanged"]
            + [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert other.returncode == 0, other.stderr[-2000:]
        assert os.path.ismount(path) and built.image_id in tiny_store.podman.mounted_images()
    finally:
        alive.kill()
        alive.wait()
    # The control: the same store in this namespace gives the killed holder's mount back.
    tiny_store.root(built)
    tiny_store.close()
    assert not os.path.ismount(path)


@needs_podman
def test_an_empty_folder_added_to_the_context_rebuilds_the_image(tiny_store: ImageStore, tmp_path: Path):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY . /app\n")
    first = tiny_store.ensure("env", env)
    (tmp_path / "ctx" / "data").mkdir()
    second = tiny_store.ensure("env", env)
    assert second.built and second.image_id != first.image_id
    assert (tiny_store.root(second).path / "app" / "data").is_dir()
    tiny_store.close()


@needs_podman
def test_a_build_interrupted_by_ctrl_c_leaves_no_process_and_no_container(
    tiny_store: ImageStore, tmp_path: Path
):
    marker = f"spin-{secrets.token_hex(6)}"
    spin = recipe(
        tmp_path / "ctx",
        f'FROM {TINY}\nRUN ["/usr/bin/sh", "-c", "echo started; while :; do :; done # {marker}"]\n',
    )
    script = (
        "from harnessrl.environments.config import ImageRecipe\n"
        "from harnessrl.environments.store import ImageStore\n"
        f"store = ImageStore({str(tiny_store.folder)!r}, ca_bundle=None)\n"
        f"store.ensure('spin', ImageRecipe(containerfile={spin.containerfile!r}))\n"
    )
    building = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        # Interrupted once the RUN step runs (before it, there would be no step to leave behind).
        logs = tiny_store.folder / "logs"
        # The step's own output line: the log's "STEP 2/3: RUN [... echo started ...]" names it
        # before it runs, and an interrupt then (no step process yet) left the working container.
        while not any("started" in log.read_text().splitlines() for log in logs.glob("spin-*.log")):
            assert building.poll() is None, building.stderr.read()
            threading.Event().wait(0.1)
        building.send_signal(signal.SIGINT)  # Ctrl-C reaches the controller's process group only
        assert "KeyboardInterrupt" in building.communicate(timeout=120)[1]
        assert processes_running(marker) == []
        containers = tiny_store.podman.run("ps", "--all", "--external", "--format", "json").stdout
        assert json.loads(containers or "[]") == []
    finally:
        building.kill()
        building.wait()
        for pid in processes_running(marker):  # the old behaviour: never leave a spinning process
            os.kill(pid, 9)


@needs_podman
def test_mmdebstrap_past_its_timeout_is_killed_with_every_process_it_started(
    tiny_store: ImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A stand-in mmdebstrap (the real one needs a Debian mirror) that starts a worker, as the real
    # one starts apt and dpkg, and waits for it.
    marker = f"apt-{secrets.token_hex(6)}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(
        f'#!/bin/sh\n/usr/bin/sh -c "while :; do sleep 1; done # {marker}" &\necho started\nwait\n'
    )
    (bin_dir / "mmdebstrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    tiny_store.build_timeout_s = 5
    try:
        with pytest.raises(ImageError, match="mmdebstrap ran over 5 s"):
            tiny_store.ensure("deb", ImageRecipe(debian={"suite": "bookworm"}))
        assert "started" in next((tiny_store.folder / "logs").glob("deb-*.log")).read_text()
        assert processes_running(marker) == []
        assert list((tiny_store.folder / "tmp").iterdir()) == []
    finally:
        for pid in processes_running(marker):  # the old behaviour: never leave the worker running
            os.kill(pid, 9)


@needs_podman
def test_a_store_podman_cannot_read_is_an_error_not_a_missing_image(tmp_path: Path):
    missing = ImageRecipe(image="localhost/x:1")
    good = ImageStore(tmp_path / "good", ca_bundle=None)
    broken = ImageStore(tmp_path / "broken", ca_bundle=None)
    broken.folder.mkdir()
    (broken.folder / "storage").write_text("")  # podman cannot make its storage there
    try:
        with pytest.raises(ImageError, match="'localhost/x:1' does not exist in the image store"):
            good.ensure("x", missing)  # the control: a store that works, without the image
        with pytest.raises(ImageError, match="podman image exists localhost/x:1 failed") as err:
            broken.ensure("x", missing)
        assert "not a directory" in str(err.value) and "does not exist in the image store" not in str(
            err.value
        )
    finally:
        empty_store(good)
        shutil.rmtree(broken.podman.runroot, ignore_errors=True)  # it holds no image to remove


@needs_podman
def test_a_store_folder_with_a_quote_in_its_path_works(tmp_path: Path):
    store = ImageStore(tmp_path / 'my "images"', ca_bundle=None)
    try:
        store.podman.import_tar(tiny_tar(tmp_path / "tiny.tar"), TINY, labels={})
        assert store.podman.exists(TINY) and store.podman.graphroot.is_dir()
    finally:
        empty_store(store)


@needs_podman
def test_a_stopped_build_leaves_another_environments_image_of_the_same_recipe(
    tiny_store: ImageStore, tmp_path: Path
):
    # Two repositories sharing one Containerfile: two environments, one recipe digest.
    shared = recipe(tmp_path / "ctx", f'FROM {TINY}\nCOPY token /token\nRUN ["/usr/bin/cat", "/token"]\n')
    b = tiny_store.ensure("repo-b", shared)
    root = tiny_store.root(b)  # a running sandbox's root
    stop = BuildStop()
    stop.stop()  # repo-a's rollout was cancelled while its image was built on demand
    with stoppable(stop), pytest.raises(Stopped):
        tiny_store.ensure("repo-a", shared)
    assert tiny_store.podman.exists(b.reference) and tiny_store.podman.exists(
        "localhost/harnessrl/repo-b:latest"
    )
    assert os.path.ismount(root.path) and (root.path / "token").is_file()
    left = tiny_store.podman.images(label=f"io.harnessrl.recipe={b.digest}", all_=True)
    assert {image["Labels"]["io.harnessrl.name"] for image in left} == {"repo-b"}  # repo-a's partials gone
    tiny_store.close()


@needs_podman
def test_prune_keep_keeps_the_base_its_recipes_are_built_from(tiny_store: ImageStore, tmp_path: Path):
    # A shared base built by another config; this config's recipe starts FROM it.
    tiny_store.ensure("base", recipe(tmp_path / "base", f"FROM {TINY}\nCOPY token /token\n"))
    proj = recipe(tmp_path / "proj", "FROM localhost/harnessrl/base:latest\nCOPY token /token2\n")
    built = tiny_store.ensure("proj", proj)
    other = tiny_store.ensure("other", recipe(tmp_path / "other", f"FROM {TINY}\nCOPY token /t\n"))
    config = tmp_path / "keep.toml"
    config.write_text(
        f"[harness.environment.images.proj]\ncontainerfile = {json.dumps(proj.containerfile)}\n"
    )
    report = prune(tiny_store, "--keep", str(config))
    assert report["removed"] == [{"name": "other", "id": other.image_id[:12]}]  # the control: the rest goes
    again = ImageStore(tiny_store.folder, ca_bundle=None).ensure("proj", proj)  # the kept env still works
    assert again.image_id == built.image_id and not again.built


@needs_podman
@pytest.mark.parametrize("timeout", ["inf", "1e400"])
def test_an_unbounded_build_timeout_is_a_config_error_not_a_traceback(tmp_path: Path, timeout: str):
    # pull = true and an image that is not here: a pull from 127.0.0.1, which refuses at once.
    config = tmp_path / "images.toml"
    config.write_text(
        f"[harness.environment]\npull = true\nbuild_timeout_s = {timeout}\n"
        '[harness.environment.images.env]\nimage = "localhost/harnessrl-nothing-here:1"\n'
    )
    store = ImageStore(tmp_path / "store")
    try:
        done = subprocess.run(
            [*HARNESSRL, "images", "build", str(config), "--store", str(store.folder)],
            capture_output=True,
            text=True,
        )
    finally:
        empty_store(store)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "harness.environment.build_timeout_s: Input should be less than or equal to" in done.stderr


@needs_podman
def test_prune_removes_the_logs_of_removed_images_but_not_a_running_builds(
    tiny_store: ImageStore, tmp_path: Path
):
    logs = tiny_store.folder / "logs"
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n", token="v1")
    v1 = tiny_store.ensure("env", env)
    (tmp_path / "ctx" / "token").write_text("v2")
    v2 = tiny_store.ensure("env", env)  # v1 superseded: the default prune removes it
    # Another environment's build, going on while prune runs (its RUN step waits for the test).
    go = tmp_path / "go"
    go.write_text("")
    tiny_store.ca_bundle = str(go)
    slow = recipe(
        tmp_path / "slow", f'FROM {TINY}\nRUN ["/usr/bin/sh", "-c", "while ! [ -s {go} ]; do :; done"]\n'
    )
    building = threading.Thread(target=lambda: tiny_store.ensure("slow", slow))
    building.start()
    try:
        wait_for("the RUN step", lambda: any(": RUN " in p.read_text() for p in logs.glob("slow-*.log")))
        report = prune(tiny_store)
    finally:
        with go.open("r+") as out:
            out.write("go")
        building.join()
    assert report["removed"] == [{"name": "env", "id": v1.image_id[:12]}]
    names = sorted(p.name for p in logs.iterdir())
    assert f"env-{v1.digest[:16]}.log" not in names  # was kept for good: one more log per build
    assert f"env-{v2.digest[:16]}.log" in names  # the control: the current image's log stays
    assert [n for n in names if n.startswith("slow-")] != []  # the running build's log stays


@needs_podman
def test_a_build_whose_podman_is_killed_outright_leaves_no_working_container(
    tiny_store: ImageStore, tmp_path: Path, held: HeldDownload
):
    # ADD from a server on 127.0.0.1 that answers only when the test says: the build's podman is
    # killed alone (as the OOM killer does) while its working container exists, made by FROM.
    env = recipe(tmp_path / "ctx", f'FROM {TINY}\nADD {held.url} /file\nRUN ["/usr/bin/cat", "/file"]\n')
    outcome: list[BaseException] = []

    def build() -> None:
        try:
            tiny_store.ensure("add", env)
        except ImageError as exc:
            outcome.append(exc)

    building = threading.Thread(target=build)
    building.start()
    try:
        wait_for("the ADD step's download", held.asked.is_set)
        containers = tiny_store.podman.run("ps", "--all", "--external", "--format", "json").stdout
        assert json.loads(containers or "[]") != []  # the control: the working container is there
        (client,) = [p for p in processes_running(str(tmp_path / "ctx")) if p != os.getpid()]
        os.kill(client, signal.SIGKILL)  # podman alone, not what it started
    finally:
        held.answer.set()
        building.join()
    assert outcome and "podman build exited -9" in str(outcome[0])
    containers = tiny_store.podman.run("ps", "--all", "--external", "--format", "json").stdout
    assert json.loads(containers or "[]") == []  # was: the working container, mounted, for good


def test_the_import_of_a_debian_base_has_the_build_s_limit_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # Stand-ins: mmdebstrap (the real one needs a Debian mirror) writes a root filesystem; podman's
    # import hangs. The import had a fixed 600 s whatever build_timeout_s said: a big root
    # filesystem on a slow disk failed, and a hung podman held the build 600 s.
    marker = f"import-{secrets.token_hex(6)}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mmdebstrap").write_text(
        f'#!/bin/sh\ncp {tiny_tar(tmp_path / "tiny.tar")} "$(eval echo \\${{$(($#-1))}})"\n'
    )
    (bin_dir / "podman").write_text(
        f'#!/bin/sh\necho started\nexec /usr/bin/sh -c "while :; do sleep 1; done # {marker}"\n'
    )
    for program in bin_dir.iterdir():
        program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HARNESSRL_PODMAN", str(bin_dir / "podman"))
    try:
        with pytest.raises(
            ImageError, match=r"importing the Debian base localhost/d:1 ran over 2 s .*build_timeout_s"
        ):
            make_debian_base(
                Podman(tmp_path / "store"),
                DebianBase(),
                "localhost/d:1",
                labels={},
                log=tmp_path / "deb.log",
                tmp_root=tmp_path / "store" / "tmp",
                timeout_s=2,
                where="environment 'deb'",
            )
        assert processes_running(marker) == []
        assert list((tmp_path / "store" / "tmp").iterdir()) == []
    finally:
        for pid in processes_running(marker):
            os.kill(pid, 9)


def _someone_waits_on(lock: Path) -> bool:
    """Whether a process or thread waits for a ``flock`` of ``lock`` (a ``->`` line of /proc/locks)."""
    if not lock.exists():
        return False
    inode = lock.stat().st_ino
    return any(
        line.split()[1] == "->" and line.split()[6].rpartition(":")[2] == str(inode)
        for line in Path("/proc/locks").read_text().splitlines()
    )


class MountingDuringPrune(Podman):
    """A run (another store object on the same folder, in a thread) mounts the image after prune
    looked at the mounts and before it removes the image."""

    def __init__(self, store: Path, run: ImageStore, built: BuiltImage):
        super().__init__(store)
        self.run_store, self.built = run, built
        self.roots: list[ImageRoot | ImageError] = []
        self.thread: threading.Thread | None = None

    def remove(self, ref: str) -> bool:
        thread = threading.Thread(target=self._start_run)
        thread.start()
        lock = self.store / "locks" / "mounts.lock"
        wait_for(
            "the run to mount, or to wait for prune", lambda: not thread.is_alive() or _someone_waits_on(lock)
        )
        self.thread = thread
        return super().remove(ref)

    def _start_run(self) -> None:
        try:
            self.roots.append(self.run_store.root(self.built))
        except ImageError as exc:
            self.roots.append(exc)


@needs_podman
def test_an_image_a_run_mounts_while_prune_runs_is_not_removed_under_it(
    tiny_store: ImageStore, tmp_path: Path
):
    reference = "localhost/harnessrl/env:1"
    tiny_store.podman.import_tar(tiny_tar(tmp_path / "env.tar"), reference, labels={LABEL_NAME: "env"})
    built = BuiltImage("env", reference, tiny_store.podman.inspect(reference)["Id"], "")
    run = ImageStore(tiny_store.folder, ca_bundle=None)
    pruning = ImageStore(tiny_store.folder, ca_bundle=None)
    pruning.podman = podman = MountingDuringPrune(tiny_store.folder, run, built)
    try:
        report = pruning.prune(keep=set())
        assert podman.thread is not None
        podman.thread.join()
        [root] = podman.roots
        # Either the run mounted first and prune left its image (in use), or prune removed it first
        # and the run was refused (an error, before anything ran); never a run on a removed image.
        if isinstance(root, ImageError):
            assert report["removed"] == [{"name": "env", "id": built.image_id[:12]}]
        else:
            assert os.path.ismount(root.path) and tiny_store.podman.exists(built.image_id)
            assert report["in_use"] == [{"name": "env", "id": built.image_id[:12]}]
    finally:
        run.close()


@needs_podman
def test_an_image_under_the_tag_made_from_another_recipe_is_not_used(tiny_store: ImageStore, tmp_path: Path):
    # The tag keeps 16 hex digits of the recipe's digest. An image another recipe made, whose digest
    # starts alike (64 bits: a collision one can craft), was taken as this recipe's image: the task
    # ran in the other recipe's environment.
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n", token="mine")
    bases = {TINY: tiny_store.podman.inspect(TINY)["Id"]}
    digest = recipe_digest(tmp_path / "ctx" / "Containerfile", tmp_path / "ctx", {}, bases)
    other = digest[:16] + ("0" if digest[16] != "0" else "1") * 48
    tiny_store.podman.import_tar(
        tiny_tar(tmp_path / "other.tar"), own_reference("env", digest), labels={LABEL_RECIPE: other}
    )
    impostor = tiny_store.podman.inspect(own_reference("env", digest))["Id"]
    assert tiny_store.current_id("env", env) is None  # not this recipe's image
    built = tiny_store.ensure("env", env)
    assert built.built and built.image_id != impostor and built.digest == digest
    assert (tiny_store.root(built).path / "token").read_text() == "mine"


class EditingPodman(Podman):
    """The recipe's context is edited while its image is built (a checkout of its repository)."""

    def __init__(self, store: Path, edit: Path):
        super().__init__(store)
        self.edit = edit

    def build(self, containerfile: Path, context: Path, **kwargs) -> None:  # type: ignore[override]
        self.edit.write_text("changed")
        super().build(containerfile, context, **kwargs)


@needs_podman
def test_a_recipe_changed_during_its_build_keeps_no_image_under_the_old_digest(
    tiny_store: ImageStore, tmp_path: Path
):
    env = recipe(tmp_path / "ctx", f"FROM {TINY}\nCOPY token /token\n", token="before")
    bases = {TINY: tiny_store.podman.inspect(TINY)["Id"]}
    before = recipe_digest(tmp_path / "ctx" / "Containerfile", tmp_path / "ctx", {}, bases)
    podman = tiny_store.podman
    tiny_store.podman = EditingPodman(tiny_store.folder, edit=tmp_path / "ctx" / "token")
    with pytest.raises(ImageError, match="changed while image .* was built; the image was not kept"):
        tiny_store.ensure("env", env)
    tiny_store.podman = podman
    # Nothing answers for the old recipe (its image held the changed token) ...
    assert not podman.exists(own_reference("env", before)) and tiny_store.list() == []
    # ... and the recipe as it is now builds as usual.
    built = tiny_store.ensure("env", env)
    assert built.built and (tiny_store.root(built).path / "token").read_text() == "changed"
