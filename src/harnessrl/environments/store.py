"""The image store: environments built on demand, cached by their recipe's content, listed and pruned.

``ImageStore.ensure(name, recipe)`` returns a ``BuiltImage`` for one environment:

- an ``image`` reference is used when it exists here (``pull = true`` pulls it first when it does not,
  on machines with a registry); otherwise an ``ImageError`` says so before anything runs;
- a ``containerfile`` recipe is checked (``recipes.check_recipe``), its digest computed, and the image
  ``localhost/harnessrl/<name>:<digest>`` built with podman unless it exists (a cache hit costs one
  ``podman image exists``). A recipe ``FROM localhost/harnessrl/<other>:latest`` builds ``<other>``
  (another configured environment) first, and the base's image id is part of its digest;
- a ``debian`` base is made with ``mmdebstrap`` and imported (``podman import``), cached by its spec.

Concurrent processes (pytest-xdist workers, several controllers) build one image once: a build holds
a lock file per digest. A failed build raises an ``ImageError`` naming the environment and showing the
tail of the build's log (kept in ``<store>/logs/``). ``root(built)`` mounts the image read-only and
returns the ``ImageRoot`` a sandbox runs on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.environments.config import EnvironmentConfig, ImageRecipe
from harnessrl.environments.podman import ImageError, Podman, log_tail
from harnessrl.environments.recipes import base_images, check_recipe, debian_digest, recipe_digest
from harnessrl.sandbox.rootfs import ImageRoot

PREFIX = "localhost/harnessrl/"
LABEL_RECIPE = "io.harnessrl.recipe"
LABEL_NAME = "io.harnessrl.name"
_OWN_BASE = re.compile(r"^(?:localhost/)?harnessrl/([a-z0-9][a-z0-9._-]*)(?::latest)?$")


def default_store() -> Path:
    """``$HARNESSRL_CACHE_DIR/containers`` (the tests point it into the checkout), else
    ``~/.cache/harnessrl/containers``."""
    cache = os.environ.get("HARNESSRL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "harnessrl")
    return Path(cache) / "containers"


def slug(name: str) -> str:
    """An environment name as the last part of an image name (``swe/inflection`` -> ``swe-inflection``)."""
    out = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    return out or "env"


def own_reference(name: str, digest: str) -> str:
    return f"{PREFIX}{slug(name)}:{digest[:16]}"


@dataclass(frozen=True)
class BuiltImage:
    name: str  # the environment's name
    reference: str  # what podman (and a cluster, once pushed) calls it
    image_id: str
    digest: str  # the recipe's digest; "" for a plain image reference
    built: bool = False  # built (or pulled) by this call; False: it was in the store
    seconds: float = 0.0  # what this call took


class ImageStore:
    """Images of one storage folder (``store``; default ``default_store()``)."""

    def __init__(
        self,
        store: Path | None = None,
        *,
        ca_bundle: str | None = "/etc/ssl/certs/ca-certificates.crt",
        build_timeout_s: float = 1800.0,
        pull: bool = False,
    ):
        self.podman = Podman(Path(store) if store else default_store())
        self.ca_bundle = ca_bundle
        self.build_timeout_s = build_timeout_s
        self.allow_pull = pull
        self._roots: dict[str, ImageRoot] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: EnvironmentConfig) -> ImageStore:
        return cls(
            Path(config.store) if config.store else None,
            ca_bundle=config.build_ca_bundle,
            build_timeout_s=config.build_timeout_s,
            pull=config.pull,
        )

    @property
    def folder(self) -> Path:
        return self.podman.store

    # -- building ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, digest: str) -> Iterator[None]:
        locks = self.folder / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{digest[:32]}.lock").open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def ensure(
        self,
        name: str,
        recipe: ImageRecipe,
        *,
        recipes: Mapping[str, ImageRecipe] | None = None,
        where: str | None = None,
        _seen: tuple[str, ...] = (),
    ) -> BuiltImage:
        """The image of environment ``name`` (built, imported or pulled if it is not here yet).
        ``recipes`` are the other configured environments (bases a recipe names); ``where`` says in
        errors which task or repository needed it."""
        where = where or f"environment {name!r}"
        started = time.monotonic()
        if recipe.image is not None:
            return self._existing(name, recipe.image, where, started)
        if recipe.debian is not None:
            return self._debian(name, recipe, where, started)
        assert recipe.containerfile is not None  # invariant: ImageRecipe validates exactly one kind
        containerfile = Path(recipe.containerfile)
        context = Path(recipe.context) if recipe.context else containerfile.parent
        check_recipe(containerfile, context, where=where)
        base_ids: dict[str, str] = {}
        for base in base_images(containerfile):
            own = _OWN_BASE.match(base)
            other = self._recipe_named(own.group(1), recipes or {}) if own else None
            if other is not None:
                if other in _seen or other == name:
                    raise ImageError(
                        f"{where}: recipes start FROM each other: {' -> '.join((*_seen, name, other))}"
                    )
                built = self.ensure(
                    other, (recipes or {})[other], recipes=recipes, where=where, _seen=(*_seen, name)
                )
                self.podman.tag(built.reference, f"{PREFIX}{slug(other)}:latest")
                base_ids[base] = built.image_id
            elif self.podman.exists(base):
                base_ids[base] = self.podman.inspect(base)["Id"]
            elif not self.allow_pull:
                raise ImageError(
                    f"{where}: {containerfile.name} starts FROM {base!r}, which is not in the image store "
                    f"and pull = false (no registry is used); build it first, or set pull = true"
                )
        digest = recipe_digest(containerfile, context, recipe.build_args, base_ids)
        reference = own_reference(name, digest)
        if self.podman.exists(reference):
            image_id = self.podman.inspect(reference)["Id"]
            return BuiltImage(name, reference, image_id, digest, seconds=round(time.monotonic() - started, 3))
        with self._locked(digest):
            if not self.podman.exists(reference):  # another process may have built it meanwhile
                log = self.folder / "logs" / f"{slug(name)}-{digest[:16]}.log"
                try:
                    self.podman.build(
                        containerfile,
                        context,
                        tags=[reference, f"{PREFIX}{slug(name)}:latest"],
                        labels={LABEL_RECIPE: digest, LABEL_NAME: name},
                        build_args=recipe.build_args,
                        ca_bundle=self.ca_bundle,
                        log=log,
                        timeout=self.build_timeout_s,
                        pull=self.allow_pull,
                    )
                except ImageError as exc:
                    self._remove_partial(digest)
                    raise ImageError(
                        f"{where}: building image {reference} failed (log: {log}):\n{exc}"
                    ) from exc
                built = True
            else:
                built = False
        return BuiltImage(
            name,
            reference,
            self.podman.inspect(reference)["Id"],
            digest,
            built=built,
            seconds=round(time.monotonic() - started, 3),
        )

    def _remove_partial(self, digest: str) -> None:
        """What a failed build left (intermediate images carry its labels): removed, so a failure
        creates nothing."""
        for image in self.podman.images(label=f"{LABEL_RECIPE}={digest}", all_=True):
            self.podman.remove(image.get("Id", ""))

    @staticmethod
    def _recipe_named(image_slug: str, recipes: Mapping[str, ImageRecipe]) -> str | None:
        return next((n for n in recipes if slug(n) == image_slug), None)

    def _existing(self, name: str, reference: str, where: str, started: float) -> BuiltImage:
        pulled = False
        if not self.podman.exists(reference):
            if not self.allow_pull:
                raise ImageError(
                    f"{where}: image {reference!r} does not exist in the image store ({self.folder}) and "
                    "pull = false; build or load it first (harnessrl images build), or set "
                    "harness.environment.pull = true on a machine that reaches its registry"
                )
            with self._locked(reference.replace("/", "_")):
                if not self.podman.exists(reference):
                    try:
                        self.podman.pull(reference, timeout=self.build_timeout_s)
                    except ImageError as exc:
                        raise ImageError(f"{where}: pulling image {reference!r} failed: {exc}") from exc
                    pulled = True
        info = self.podman.inspect(reference)
        return BuiltImage(
            name, reference, info["Id"], "", built=pulled, seconds=round(time.monotonic() - started, 3)
        )

    def _debian(self, name: str, recipe: ImageRecipe, where: str, started: float) -> BuiltImage:
        assert recipe.debian is not None  # invariant: the caller checked the kind
        spec = recipe.debian.model_dump()
        digest = debian_digest(spec)
        reference = own_reference(name, digest)
        built = False
        if not self.podman.exists(reference):
            with self._locked(digest):
                if not self.podman.exists(reference):
                    self._mmdebstrap(name, recipe, digest, reference, where)
                    built = True
        self.podman.tag(reference, f"{PREFIX}{slug(name)}:latest")
        return BuiltImage(
            name,
            reference,
            self.podman.inspect(reference)["Id"],
            digest,
            built=built,
            seconds=round(time.monotonic() - started, 3),
        )

    def _mmdebstrap(self, name: str, recipe: ImageRecipe, digest: str, reference: str, where: str) -> None:
        debian = recipe.debian
        assert debian is not None  # invariant: the caller checked the kind
        if shutil.which("mmdebstrap") is None:
            raise ImageError(f"{where}: mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
        log = self.folder / "logs" / f"{slug(name)}-{digest[:16]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        tmp_root = self.folder / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
            tar = Path(tmp) / "rootfs.tar"
            argv = ["mmdebstrap", f"--variant={debian.variant}"]
            if debian.include:
                argv.append("--include=" + ",".join(debian.include))
            argv += [debian.suite, str(tar), debian.mirror]
            with log.open("w") as out:
                try:
                    done = subprocess.run(
                        argv, stdout=out, stderr=subprocess.STDOUT, timeout=self.build_timeout_s, check=False
                    )
                except subprocess.TimeoutExpired as exc:
                    raise ImageError(
                        f"{where}: mmdebstrap ran over {self.build_timeout_s:g} s (log: {log})"
                    ) from exc
            if done.returncode != 0:
                raise ImageError(
                    f"{where}: making the Debian base {reference} failed (mmdebstrap exited "
                    f"{done.returncode}; log: {log}):\n{log_tail(log)}"
                )
            self.podman.import_tar(tar, reference, labels={LABEL_RECIPE: digest, LABEL_NAME: name})

    # -- running -----------------------------------------------------------------------------------
    def root(self, built: BuiltImage) -> ImageRoot:
        """The image mounted read-only on this machine, as a sandbox root (mounted once per process)."""
        with self._lock:
            if built.image_id in self._roots and os.path.ismount(self._roots[built.image_id].path):
                return self._roots[built.image_id]
        info = self.podman.inspect(built.image_id)
        config = info.get("Config") or {}
        path = self.podman.mount(built.image_id)
        root = ImageRoot(
            path=path,
            name=built.reference,
            image_id=built.image_id,
            env=tuple(config.get("Env") or ()),
            volumes=tuple(sorted((config.get("Volumes") or {}).keys())),
        )
        with self._lock:
            self._roots[built.image_id] = root
        return root

    # -- listing and pruning -----------------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        """harnessrl's images here: name, reference(s), id, recipe digest, size, created."""
        rows = []
        seen: set[str] = set()
        for image in self.podman.images(label=LABEL_NAME):
            if not image.get("Names") or image.get("Id") in seen:
                continue  # a dangling layer (prune removes those), or an image listed once per tag
            seen.add(image.get("Id", ""))
            labels = image.get("Labels") or {}
            rows.append(
                {
                    "name": labels.get(LABEL_NAME, ""),
                    "references": sorted(image.get("Names") or []),
                    "id": image.get("Id", ""),
                    "recipe": labels.get(LABEL_RECIPE, ""),
                    "size_bytes": int(image.get("Size") or 0),
                    "created": image.get("CreatedAt") or image.get("Created"),
                }
            )
        return sorted(rows, key=lambda r: (r["name"], r["id"]))

    def disk_usage(self) -> dict[str, Any]:
        """Bytes on disk: the whole store (layers shared between images counted once) and each image
        (its own size as podman reports it, shared layers included)."""
        return {
            "store": str(self.folder),
            "store_bytes": folder_bytes(self.podman.graphroot),
            "images": [
                {"name": r["name"], "id": r["id"][:12], "size_bytes": r["size_bytes"]} for r in self.list()
            ],
        }

    def prune(self, keep: set[str] | None = None) -> dict[str, Any]:
        """Remove harnessrl's images whose id is not in ``keep`` (all of them when ``keep`` is None),
        then dangling layers; returns what was removed and the bytes freed."""
        before = folder_bytes(self.podman.graphroot)
        removed = []
        for row in self.list():
            if keep is not None and row["id"] in keep:
                continue
            if self.podman.remove(row["id"]):
                removed.append({"name": row["name"], "id": row["id"][:12]})
        self.podman.prune_dangling()
        with self._lock:
            self._roots = {k: v for k, v in self._roots.items() if keep is not None and k in keep}
        after = folder_bytes(self.podman.graphroot)
        return {"removed": removed, "freed_bytes": max(0, before - after), "store_bytes": after}


def folder_bytes(folder: Path) -> int:
    """Disk blocks used under ``folder`` (hard links counted once; mount points not crossed)."""
    total, seen = 0, set()
    if not folder.exists():
        return 0
    device = folder.stat().st_dev
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(dirpath, d)).st_dev == device]
        for name in files + dirs:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += info.st_blocks * 512
    return total
