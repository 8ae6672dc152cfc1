"""The image store: environments built on demand, cached by their recipe's content, listed and pruned.

``ImageStore.ensure(name, recipe)`` returns a ``BuiltImage`` for one environment:

- an ``image`` reference is used when it exists here (``pull = true`` pulls it first when it does not,
  on machines with a registry); otherwise an ``ImageError`` says so before anything runs;
- a ``containerfile`` recipe is checked (``recipes.check_recipe``), its digest computed, and the image
  ``localhost/harnessrl/<name>:<digest>`` built with podman unless it exists with the whole digest in
  its label (a cache hit costs a ``podman image exists`` and an ``inspect``). A recipe ``FROM localhost/harnessrl/<other>:latest`` builds ``<other>``
  (another configured environment) first, and the base's image id is part of its digest;
- a ``debian`` base is made with ``mmdebstrap`` and imported (``podman import``), cached by its spec.

Concurrent processes (pytest-xdist workers, several controllers) build one image once: a build holds
a lock file per digest, and a process that finds it held waits, then finds the image built. That wait
stops with the work that waits (a ``processes.BuildStop``: a rollout's task cancelled, Ctrl-C), with
``processes.Stopped``, leaving the lock's holder and its build alone. A failed build raises an
``ImageError`` naming the environment and showing the tail of the build's log (kept in
``<store>/logs/``). ``root(built)`` mounts the image read-only and returns the ``ImageRoot`` a sandbox
runs on; ``close()`` gives the mounts back.

A process that dies without ``close()`` (SIGKILL, OOM) would keep its mounts counted by podman for
good: ``root()`` and ``prune()`` first give back the mounts of processes that are gone
(``mounts.MountRecords``). Debian bases are made by ``debian.make_debian_base``.

Every ``ensure`` tags the image it returns ``localhost/harnessrl/<name>:latest``: the default prune
keeps those, and never removes an image mounted by a process (a run using it).

The store's parts: ``naming`` (tags, labels, the digest check), ``locks`` (the build lock, the
store-wide mounts lock), ``building`` (``podman build``, ``mmdebstrap``), ``pruning`` (listing,
disk use, prune); ``mounts`` records the mounts.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.environments.building import build_containerfile, build_debian
from harnessrl.environments.config import EnvironmentConfig, ImageRecipe, slug
from harnessrl.environments.locks import LOCK_POLL_S, build_lock, mounts_lock
from harnessrl.environments.mounts import MountRecords
from harnessrl.environments.naming import (
    LABEL_NAME,
    LABEL_RECIPE,
    OWN_BASE,
    PREFIX,
    default_store,
    latest_reference,
    made_from,
    own_reference,
    recipe_named,
)
from harnessrl.environments.podman import ImageError, Podman
from harnessrl.environments.pruning import folder_bytes, list_images, prune_logs, remove_images
from harnessrl.environments.recipes import base_images, check_recipe, debian_digest, recipe_digest
from harnessrl.sandbox.rootfs import ImageRoot

# Importable from here, as before the store was split by concept.
__all__ = [
    "LABEL_NAME",
    "LABEL_RECIPE",
    "LOCK_POLL_S",
    "PREFIX",
    "BuiltImage",
    "ImageStore",
    "default_store",
    "folder_bytes",
    "latest_reference",
    "own_reference",
    "slug",
]


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
        self._mounts = MountRecords(self.podman)  # one record per image this store holds mounted
        self._reaped = False  # reap_orphans ran at this store's first ensure

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

    # -- finding or building -----------------------------------------------------------------------
    def ensure(
        self,
        name: str,
        recipe: ImageRecipe,
        *,
        recipes: Mapping[str, ImageRecipe] | None = None,
        where: str | None = None,
        _seen: tuple[str, ...] = (),
    ) -> BuiltImage:
        """The image of environment ``name`` (built, imported or pulled if it is not here yet), tagged
        ``localhost/harnessrl/<name>:latest``. ``recipes`` are the other configured environments
        (bases a recipe names); ``where`` says in errors which task or repository needed it."""
        where = where or f"environment {name!r}"
        started = time.monotonic()
        if not self._reaped:
            # What a process killed outright left of a build (still running, scratch) goes at the
            # first use of the store, and before every build (``building``).
            self.podman.reap_orphans()
            self._reaped = True
        if recipe.image is not None:
            return self._existing(name, recipe.image, where, started)
        if recipe.debian is not None:
            return self._debian(name, recipe, where, started)
        assert recipe.containerfile is not None  # invariant: ImageRecipe validates exactly one kind
        containerfile = Path(recipe.containerfile)
        context = Path(recipe.context) if recipe.context else containerfile.parent
        check_recipe(containerfile, context, where=where)
        image_ids = self._image_ids(name, recipe, recipes or {}, where=where, seen=_seen, build=True)
        assert image_ids is not None  # invariant: build=True finds or makes every image or raises
        digest = recipe_digest(containerfile, context, recipe.build_args, image_ids)
        reference = own_reference(name, digest)
        built = False
        if made_from(self.podman, reference, digest) is None:
            with build_lock(self.folder, digest):
                # Another process may have built it meanwhile.
                if made_from(self.podman, reference, digest) is None:
                    build_containerfile(
                        self.podman,
                        name,
                        containerfile=containerfile,
                        context=context,
                        build_args=recipe.build_args,
                        digest=digest,
                        reference=reference,
                        image_ids=image_ids,
                        where=where,
                        ca_bundle=self.ca_bundle,
                        timeout_s=self.build_timeout_s,
                    )
                    built = True
        # :latest follows the recipe in use on every call, not only on a build: after v1 -> v2 -> v1
        # it names v1 again, which prune's default keeps.
        self.podman.tag(reference, latest_reference(name))
        return BuiltImage(
            name,
            reference,
            self.podman.inspect(reference)["Id"],
            digest,
            built=built,
            seconds=round(time.monotonic() - started, 3),
        )

    def current_id(
        self, name: str, recipe: ImageRecipe, recipes: Mapping[str, ImageRecipe] | None = None
    ) -> str | None:
        """The id of the image ``ensure`` would return for this recipe now, None when it is not here
        (nothing is built, imported or pulled)."""
        return self._current(name, recipe, recipes or {})[0]

    def needed_ids(
        self, name: str, recipe: ImageRecipe, recipes: Mapping[str, ImageRecipe] | None = None
    ) -> set[str]:
        """What ``ensure`` needs to find (or rebuild) this environment without pulling: its current
        image and every image its recipe reads (a base that no recipe here makes, an image it copies
        from). What ``prune --keep`` keeps: keeping the image alone removed its base, and the next
        ``ensure`` refused the recipe (its base "not in the image store"). Nothing is built."""
        image_id, read = self._current(name, recipe, recipes or {})
        return read | ({image_id} if image_id else set())

    def _current(
        self, name: str, recipe: ImageRecipe, recipes: Mapping[str, ImageRecipe]
    ) -> tuple[str | None, set[str]]:
        """``(id of the image ensure would return now or None, ids of the images its recipe reads)``."""
        where = f"environment {name!r}"
        if recipe.image is not None:
            found = self.podman.inspect(recipe.image)["Id"] if self.podman.exists(recipe.image) else None
            return found, set()
        if recipe.debian is not None:
            digest = debian_digest(recipe.debian.model_dump())
            return made_from(self.podman, own_reference(name, digest), digest), set()
        assert recipe.containerfile is not None  # invariant: ImageRecipe validates exactly one kind
        containerfile = Path(recipe.containerfile)
        context = Path(recipe.context) if recipe.context else containerfile.parent
        check_recipe(containerfile, context, where=where)
        image_ids = self._image_ids(name, recipe, recipes, where=where, seen=(), build=False)
        if image_ids is None:
            return None, set()
        digest = recipe_digest(containerfile, context, recipe.build_args, image_ids)
        return made_from(self.podman, own_reference(name, digest), digest), set(image_ids.values())

    def _image_ids(
        self,
        name: str,
        recipe: ImageRecipe,
        recipes: Mapping[str, ImageRecipe],
        *,
        where: str,
        seen: tuple[str, ...],
        build: bool,
    ) -> dict[str, str] | None:
        """The id of each image the recipe reads (``base_images``), as the Containerfile names it.
        ``build``: a configured base is built and a missing image pulled (pull = true); else None
        when one is not here."""
        assert recipe.containerfile is not None  # invariant: the caller checked the kind
        containerfile = Path(recipe.containerfile)
        try:
            images = base_images(containerfile, recipe.build_args)
        except ImageError as exc:
            raise ImageError(f"{where}: {containerfile.name}: {exc}") from exc
        image_ids: dict[str, str] = {}
        for image in images:
            own = OWN_BASE.match(image)
            other = recipe_named(own.group(1), recipes) if own else None
            if other is not None:
                if other in seen or other == name:
                    raise ImageError(
                        f"{where}: recipes start FROM each other: {' -> '.join((*seen, name, other))}"
                    )
                if build:
                    image_id = self.ensure(
                        other, recipes[other], recipes=recipes, where=where, _seen=(*seen, name)
                    ).image_id
                else:
                    found = self.current_id(other, recipes[other], recipes)
                    if found is None:
                        return None
                    image_id = found
            else:
                # An own image no recipe here makes is looked up by its full name (a short
                # harnessrl/<x> would mean docker.io/harnessrl/<x>).
                lookup = f"{PREFIX}{own.group(1)}:latest" if own else image
                if not self.podman.exists(lookup):
                    if not build:
                        return None
                    if not self.allow_pull:
                        raise ImageError(
                            f"{where}: {containerfile.name} reads the image {image!r}, which is not in the "
                            f"image store and pull = false (no registry is used); build it first, or set "
                            "pull = true"
                        )
                    try:
                        self.podman.pull(lookup, timeout=self.build_timeout_s)
                    except ImageError as exc:
                        raise ImageError(f"{where}: pulling image {image!r} failed: {exc}") from exc
                image_id = self.podman.inspect(lookup)["Id"]
            image_ids[image] = image_id
        return image_ids

    def _existing(self, name: str, reference: str, where: str, started: float) -> BuiltImage:
        pulled = False
        if not self.podman.exists(reference):
            if not self.allow_pull:
                raise ImageError(
                    f"{where}: image {reference!r} does not exist in the image store ({self.folder}) and "
                    "pull = false; build or load it first (harnessrl images build), or set "
                    "harness.environment.pull = true on a machine that reaches its registry"
                )
            # A lock per reference (its hash: the lock's name keeps 32 characters, which every
            # docker.io/jyangballin/swesmith.x86_64.<repo> shares, and would make pulls wait in turn).
            with build_lock(self.folder, hashlib.sha256(reference.encode()).hexdigest()):
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
        if made_from(self.podman, reference, digest) is None:
            with build_lock(self.folder, digest):
                if made_from(self.podman, reference, digest) is None:
                    build_debian(
                        self.podman,
                        name,
                        recipe.debian,
                        digest=digest,
                        reference=reference,
                        where=where,
                        timeout_s=self.build_timeout_s,
                    )
                    built = True
        self.podman.tag(reference, latest_reference(name))
        return BuiltImage(
            name,
            reference,
            self.podman.inspect(reference)["Id"],
            digest,
            built=built,
            seconds=round(time.monotonic() - started, 3),
        )

    # -- running -----------------------------------------------------------------------------------
    def root(self, built: BuiltImage) -> ImageRoot:
        """The image mounted read-only on this machine, as a sandbox root (mounted once per process
        and store, until ``close``)."""
        # Held while mounting: two threads asking at once must not mount twice (podman counts each).
        with self._lock:
            known = self._roots.get(built.image_id)
            if known is not None and os.path.ismount(known.path):
                return known
            self._mounts.give_back_stale()
            info = self.podman.inspect(built.image_id)
            config = info.get("Config") or {}
            with mounts_lock(self.folder, pruning=False):  # not while a prune removes images
                path = self.podman.mount(built.image_id)
                self._mounts.add(built.image_id)  # after the mount (``MountRecords.add``)
            root = ImageRoot(
                path=path,
                name=built.reference,
                image_id=built.image_id,
                env=tuple(config.get("Env") or ()),
                volumes=tuple(sorted((config.get("Volumes") or {}).keys())),
            )
            self._roots[built.image_id] = root
            return root

    def close(self) -> None:
        """Give back this store's mounts (podman unmounts an image when no other process holds it).
        Sandboxes on these roots must have finished."""
        with self._lock:
            roots, self._roots = self._roots, {}
        for image_id in roots:
            self._mounts.remove(image_id)  # before the unmount (``MountRecords.remove``)
            self.podman.unmount(image_id, force=False)

    @property
    def exists(self) -> bool:
        """Whether the folder holds an image store (commands that only read never create one)."""
        return self.podman.graphroot.is_dir()

    # -- listing and pruning -----------------------------------------------------------------------
    def list(self) -> list[dict[str, Any]]:
        """harnessrl's images here: name, reference(s), id, recipe digest, size, created."""
        return list_images(self.podman)

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
        """Remove harnessrl's images whose id is not in ``keep`` and that no process has mounted (a
        run is using it), then dangling layers and the build logs of images no longer here (not a
        running build's); ``keep`` None removes every image, mounted or not.
        Returns what was removed, what was kept because it is in use, and the bytes freed."""
        self.podman.reap_orphans()  # a killed process's build holds nothing in use
        if not self.exists:
            return {"removed": [], "in_use": [], "freed_bytes": 0, "store_bytes": 0}
        before = folder_bytes(self.podman.graphroot)
        removed, in_use, mounted = remove_images(self.podman, self._mounts, keep)
        self.podman.prune_dangling()
        logs_freed = prune_logs(self.podman)
        with self._lock:
            self._roots = {k: v for k, v in self._roots.items() if keep is not None and k in keep | mounted}
        after = folder_bytes(self.podman.graphroot)
        return {
            "removed": removed,
            "in_use": in_use,
            "freed_bytes": max(0, before - after) + logs_freed,
            "store_bytes": after,
        }
