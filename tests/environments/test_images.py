"""Images with the real container tool: built once and cached by content, listed, pruned; and bad input
refused with a clear error before anything is created (a missing image, a failing build, a recipe
reading outside its context, an image that cannot run the harness).

Each throwaway recipe carries a random token (its own digest) and is removed by its test; the
example's images are shared with every other test (``image_support.py``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.environments.image_support import (
    EXAMPLE,
    environment_toml,
    environments,
    example_environment,
    needs_images,
)

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets import apply_preset
from harnessrl.controller.stack import check_environments
from harnessrl.environments.config import EnvironmentConfig
from harnessrl.environments.podman import ImageError
from harnessrl.environments.resolve import Environments
from harnessrl.environments.store import ImageStore

pytestmark = needs_images
HARNESSRL = [sys.executable, "-m", "harnessrl"]


def throwaway(tmp_path: Path, body: str, name: str = "throwaway") -> dict:
    """An environment section with the example's base and one recipe of ``body`` (+ a random token)."""
    context = tmp_path / "ctx"
    context.mkdir(exist_ok=True)
    (context / "token.txt").write_text(secrets.token_hex(8))
    (context / "Containerfile").write_text(
        f"FROM localhost/harnessrl/swe-base:latest\nCOPY token.txt /token.txt\n{body}"
    )
    base = example_environment()["images"]["swe-base"]
    return {
        "field": "image_name",
        "images": {"swe-base": base, name: {"containerfile": str(context / "Containerfile")}},
    }


def harnessrl_ids(store: ImageStore) -> set[str]:
    return {row["id"] for row in store.list()}


def images_named(store: ImageStore, name: str) -> list[dict]:
    """Every image of environment ``name`` in the store, intermediate layers included."""
    return store.podman.images(label=f"io.harnessrl.name={name}", all_=True)


def test_an_image_is_built_once_and_then_found_in_the_store(tmp_path: Path):
    # A store of its own (FROM scratch needs no base), so pruning here touches no other test's images.
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "token.txt").write_text(secrets.token_hex(8))
    (context / "Containerfile").write_text("FROM scratch\nCOPY token.txt /token.txt\n")
    section = {
        "store": str(tmp_path / "store"),
        "images": {"throwaway": {"containerfile": str(context / "Containerfile")}},
    }
    config = EnvironmentConfig.model_validate(section)
    store = ImageStore.from_config(config)
    try:
        first = store.ensure("throwaway", config.images["throwaway"], recipes=config.images)
        again = ImageStore.from_config(config).ensure(
            "throwaway", config.images["throwaway"], recipes=config.images
        )
        assert first.built and not again.built and again.image_id == first.image_id  # cached by content
        assert first.reference == f"localhost/harnessrl/throwaway:{first.digest[:16]}"
        (context / "token.txt").write_text("changed")  # the recipe's content changed
        changed = store.ensure("throwaway", config.images["throwaway"], recipes=config.images)
        assert changed.built and changed.image_id != first.image_id and changed.digest != first.digest
        rows = {row["id"]: row for row in store.list()}
        assert rows[first.image_id]["name"] == "throwaway" and rows[first.image_id]["recipe"] == first.digest
        # Prune's default removes what a newer build superseded (no longer :latest), keeps the rest.
        pruned = subprocess.run(
            [*HARNESSRL, "images", "prune", "--store", str(tmp_path / "store")],
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(pruned.stdout.strip().splitlines()[-1])
        assert report["removed"] == [{"name": "throwaway", "id": first.image_id[:12]}]
        assert harnessrl_ids(store) == {changed.image_id}
    finally:
        store.prune(None)
        shutil.rmtree(store.podman.runroot, ignore_errors=True)


def test_images_build_list_df_on_the_example_config():
    built = subprocess.run(
        [*HARNESSRL, "images", "build", str(EXAMPLE / "train.toml")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    rows = [json.loads(line) for line in built.stdout.strip().splitlines()]
    assert [r["name"] for r in rows[:-1]] == ["swe-base", "swe/inflection", "swe/cachetools", "swe/toolz"]
    assert rows[-1]["images"] == 4 and rows[-1]["store_bytes"] > 0
    listed = subprocess.run([*HARNESSRL, "images", "list"], capture_output=True, text=True, check=True).stdout
    names = {json.loads(line)["name"] for line in listed.splitlines()}
    assert {"swe-base", "swe/inflection", "swe/cachetools", "swe/toolz"} <= names
    df = json.loads(
        subprocess.run([*HARNESSRL, "images", "df"], capture_output=True, text=True, check=True).stdout
    )
    sizes = {row["name"]: row["size_bytes"] for row in df["images"]}
    assert sizes["swe/toolz"] >= sizes["swe-base"] > 0 and df["store_bytes"] > 0


def rollout_with(
    tmp_path: Path, section: dict, task: dict, *, harness: str = 'preset = "python"\ncommand = ["-c", "pass"]'
) -> subprocess.CompletedProcess:
    (tmp_path / "script.json").write_text(json.dumps({"turns": ["unused"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "script.json"}"\n\n[harness]\n{harness}\n\n'
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n\n'
        + environment_toml(section)
    )
    (tmp_path / "task.json").write_text(json.dumps(task))
    return subprocess.run(
        [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{tmp_path / 'task.json'}"]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_a_missing_image_is_refused_before_anything_is_created(tmp_path: Path):
    section = {"field": "image_name", "images": {}}
    done = rollout_with(
        tmp_path, section, {"prompt": "x", "task_id": "t-missing", "image_name": "localhost/nope/missing:1"}
    )
    assert done.returncode == 2
    assert "task 't-missing'" in done.stderr and "'localhost/nope/missing:1' does not exist" in done.stderr
    assert "pull = false" in done.stderr
    assert not (tmp_path / "run").exists()  # no run folder, no store, no rollout


def test_a_failing_build_names_the_task_and_shows_the_log_tail(tmp_path: Path):
    token = secrets.token_hex(4)
    section = throwaway(tmp_path, f"RUN echo 'step fails: {token}' && exit 3\n", name="broken/repo")
    done = rollout_with(
        tmp_path, section, {"prompt": "x", "task_id": "t-broken", "image_name": "broken/repo"}
    )
    assert done.returncode == 2
    assert "task 't-broken' (environment 'broken/repo')" in done.stderr
    assert "building image localhost/harnessrl/broken-repo:" in done.stderr
    assert f"step fails: {token}" in done.stderr  # the build log's tail
    assert not (tmp_path / "run").exists()
    assert images_named(environments().store, "broken/repo") == []  # no image, no layer left


def test_a_recipe_reading_outside_its_context_is_refused_before_building(tmp_path: Path):
    (tmp_path / "secret.txt").write_text("host secret")
    section = throwaway(tmp_path, "COPY ../secret.txt /secret.txt\n", name="reads-outside")
    config = tmp_path / "images.toml"
    config.write_text('[harness]\ncommand = ["true"]\n\n' + environment_toml(section))
    done = subprocess.run(
        [*HARNESSRL, "images", "build", str(config), "--only", "reads-outside"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "Containerfile:3: COPY reads '../secret.txt', outside its context folder" in done.stderr
    assert images_named(environments().store, "reads-outside") == []


def test_an_image_that_cannot_run_the_harness_is_refused_naming_what_is_missing(tmp_path: Path):
    # No shell and no C library at all (FROM scratch), and an image whose TLS library was removed.
    context = tmp_path / "scratch"
    context.mkdir()
    (context / "Containerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    (context / "marker").write_text(secrets.token_hex(8))
    section = throwaway(tmp_path, "RUN rm -f /usr/lib/x86_64-linux-gnu/libssl.so.3\n", name="no-libssl")
    section["images"]["empty"] = {"containerfile": str(context / "Containerfile")}
    section["images"]["swe/inflection"] = example_environment()["images"]["swe/inflection"]
    environments_ = Environments(EnvironmentConfig.model_validate(section))
    harness = apply_preset(HarnessSpec(preset="mini-swe-agent", environment=section))
    try:
        with pytest.raises(ImageError) as empty:
            check_environments(harness, [{"task_id": "t-empty", "image_name": "empty"}])
        message = str(empty.value)
        assert "task 't-empty'" in message and "localhost/harnessrl/empty:" in message
        assert "no /bin/sh" in message and "needs the loader /lib64/ld-linux-x86-64.so.2" in message
        with pytest.raises(ImageError) as no_ssl:
            check_environments(harness, [{"task_id": "t-ssl", "image_name": "no-libssl"}])
        assert "Python's _ssl module" in str(no_ssl.value) and "libssl.so.3" in str(no_ssl.value)
        # The control: the example's image runs the same harness.
        assert check_environments(harness, [{"task_id": "t-ok", "image_name": "swe/inflection"}]) == {
            "swe/inflection": 1
        }
        # And the harness the image should bring (harness = "image") must be on its PATH.
        own = apply_preset(HarnessSpec(preset="mini-swe-agent", environment={**section, "harness": "image"}))
        with pytest.raises(ImageError, match=r"the harness command '/.*/mini': .* is not in the image"):
            check_environments(own, [{"task_id": "t-own", "image_name": "swe/inflection"}])
    finally:
        store = environments_.store
        for row in store.list():
            if row["name"] in ("empty", "no-libssl"):
                store.podman.remove(row["id"])


def test_the_host_ca_bundle_helps_the_build_and_is_not_baked_in(tmp_path: Path):
    # The example's images installed pytest from PyPI through the proxy with the host bundle mounted
    # into that RUN step; the image's own bundle is Debian's, not the host's.
    root = environments().root("swe/inflection", where="test")
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt").read_bytes()
    image_bundle = root.path / "etc/ssl/certs/ca-certificates.crt"
    assert (root.path / "usr/local/lib").exists()
    assert not image_bundle.exists() or image_bundle.read_bytes() != host_bundle
    assert (root.path / "opt/swe/requirements-test.txt").is_file()


def test_prune_keep_and_all_in_a_store_of_its_own(tmp_path: Path):
    # FROM scratch recipes need no base: a private store, emptied and removed at the end.
    store_dir = tmp_path / "store"
    images = {}
    for name in ("keep-me", "drop-me", "by-ref"):
        context = tmp_path / name
        context.mkdir()
        (context / "token").write_text(secrets.token_hex(8))
        (context / "Containerfile").write_text("FROM scratch\nCOPY token /token\n")
        images[name] = {"containerfile": str(context / "Containerfile")}
    config = tmp_path / "both.toml"
    config.write_text('[harness]\ncommand = ["true"]\n\n' + environment_toml({"images": images}))
    keep = tmp_path / "keep.toml"
    store = ImageStore(store_dir)
    try:
        built = subprocess.run(
            [*HARNESSRL, "images", "build", str(config), "--store", str(store_dir)],
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stderr[-2000:]
        # Progress on stderr, naming each environment and where its build log goes.
        for name in ("keep-me", "drop-me", "by-ref"):
            assert f"{name}: building or finding (build logs: {store_dir / 'logs'})" in built.stderr
        assert {row["name"] for row in store.list()} == {"keep-me", "drop-me", "by-ref"}
        rows = {row["name"]: row for row in map(json.loads, built.stdout.splitlines()) if "name" in row}
        # "by-ref" kept through an ``image`` reference to harnessrl's own build: was removed.
        keep_images = {"keep-me": images["keep-me"], "by-ref": {"image": rows["by-ref"]["reference"]}}
        keep.write_text('[harness]\ncommand = ["true"]\n\n' + environment_toml({"images": keep_images}))
        before = store.disk_usage()["store_bytes"]
        kept = subprocess.run(
            [*HARNESSRL, "images", "prune", "--store", str(store_dir), "--keep", str(keep)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert [r["name"] for r in json.loads(kept.stdout)["removed"]] == ["drop-me"]
        assert {row["name"] for row in store.list()} == {"keep-me", "by-ref"}
        emptied = subprocess.run(
            [*HARNESSRL, "images", "prune", "--store", str(store_dir), "--all"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert sorted(r["name"] for r in json.loads(emptied.stdout)["removed"]) == ["by-ref", "keep-me"]
        assert store.list() == [] and store.disk_usage()["store_bytes"] <= before
    finally:
        store.prune(None)
        shutil.rmtree(store.podman.runroot, ignore_errors=True)
