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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.environments.config import EnvironmentConfig, ImageRecipe, slug
from harnessrl.environments.debian import make_debian_base
from harnessrl.environments.mounts import MountRecords
from harnessrl.environments.podman import ImageError, Podman
from harnessrl.environments.processes import Stopped, current_stop, owner
from harnessrl.environments.recipes import (
    base_images,
    check_recipe,
    debian_digest,
    pin_images,
    recipe_digest,
)
from harnessrl.sandbox.rootfs import ImageRoot

PREFIX = "localhost/harnessrl/"
LABEL_RECIPE = "io.harnessrl.recipe"
LABEL_NAME = "io.harnessrl.name"
#: How often a stoppable wait for another process's build lock tries again.
LOCK_POLL_S = 0.2
_OWN_BASE = re.compile(r"^(?:localhost/)?harnessrl/([a-z0-9][a-z0-9._-]*)(?::latest)?$")


def default_store() -> Path:
    """``$HARNESSRL_CACHE_DIR/containers`` (the tests point it into the checkout), else
    ``~/.cache/harnessrl/containers``."""
    cache = os.environ.get("HARNESSRL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "harnessrl")
    return Path(cache) / "containers"


def own_reference(name: str, digest: str) -> str:
    return f"{PREFIX}{slug(name)}:{digest[:16]}"


def latest_reference(name: str) -> str:
    """The tag that names an environment's image in use (prune's default keeps it)."""
    return f"{PREFIX}{slug(name)}:latest"


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

    # -- building ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, digest: str) -> Iterator[None]:
        """Hold the build lock of ``digest`` (one builder per digest, across processes). Work under a
        ``BuildStop`` (``processes.stoppable``) waits for it polling, and a stop ends the wait with
        ``Stopped``: a blocking ``flock`` waited for the other process's whole build."""
        locks = self.folder / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / f"{digest[:32]}.lock").open("w") as fh:
            stop = current_stop()
            if stop is None:
                fcntl.flock(fh, fcntl.LOCK_EX)
            else:
                while True:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if stop.wait(LOCK_POLL_S):
                            raise Stopped("stopped while waiting for another build of the image") from None
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def _mounting(self, *, pruning: bool) -> Iterator[None]:
        """The store's mount lock, across processes: shared while a run mounts an image, exclusive
        while prune decides what is in use and removes the rest. Without it a run that mounted an
        image between prune's look at the mounts and its removal had its root unmounted and removed
        under its sandbox (podman's ``rmi`` removes a mounted image)."""
        locks = self.folder / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / "mounts.lock").open("a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX if pruning else fcntl.LOCK_SH)
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
        """The image of environment ``name`` (built, imported or pulled if it is not here yet), tagged
        ``localhost/harnessrl/<name>:latest``. ``recipes`` are the other configured environments
        (bases a recipe names); ``where`` says in errors which task or repository needed it."""
        where = where or f"environment {name!r}"
        started = time.monotonic()
        if not self._reaped:
            # What a process killed outright left of a build (still running, scratch) goes at the
            # first use of the store, and before every build (``_build``, ``_mmdebstrap``).
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
        if self._made_from(reference, digest) is None:
            with self._locked(digest):
                # Another process may have built it meanwhile.
                if self._made_from(reference, digest) is None:
                    self._build(name, recipe, digest, reference, image_ids, where)
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
            return self._made_from(own_reference(name, digest), digest), set()
        assert recipe.containerfile is not None  # invariant: ImageRecipe validates exactly one kind
        containerfile = Path(recipe.containerfile)
        context = Path(recipe.context) if recipe.context else containerfile.parent
        check_recipe(containerfile, context, where=where)
        image_ids = self._image_ids(name, recipe, recipes, where=where, seen=(), build=False)
        if image_ids is None:
            return None, set()
        digest = recipe_digest(containerfile, context, recipe.build_args, image_ids)
        return self._made_from(own_reference(name, digest), digest), set(image_ids.values())

    def _made_from(self, reference: str, digest: str) -> str | None:
        """The id of the image ``reference`` names if it was made from the recipe ``digest`` (its
        label), else None. The tag keeps 16 hex digits of the digest: an image of another recipe
        whose digest starts alike (64 bits, a collision one can craft) is not this recipe's image."""
        if not self.podman.exists(reference):
            return None
        info = self.podman.inspect(reference)
        labels = info.get("Labels") or (info.get("Config") or {}).get("Labels") or {}
        return info["Id"] if labels.get(LABEL_RECIPE) == digest else None

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
            own = _OWN_BASE.match(image)
            other = self._recipe_named(own.group(1), recipes) if own else None
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

    def _build(
        self,
        name: str,
        recipe: ImageRecipe,
        digest: str,
        reference: str,
        image_ids: Mapping[str, str],
        where: str,
    ) -> None:
        """``podman build`` of a Containerfile whose images are pinned to the ids its digest
        recorded (``pin_images``): a tag moved after the digest was computed changes nothing."""
        assert recipe.containerfile is not None  # invariant: the caller checked the kind
        containerfile = Path(recipe.containerfile)
        context = Path(recipe.context) if recipe.context else containerfile.parent
        log = self.folder / "logs" / f"{slug(name)}-{digest[:16]}.log"
        # A killed process's build of this image (its lock went with it) would write the same log and
        # tag the same image: killed first.
        self.podman.reap_orphans()
        tmp_root = self.folder / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tmp_root, prefix=f"recipe-{owner()}-") as tmp:
            pinned = Path(tmp) / containerfile.name
            pinned.write_text(pin_images(containerfile, image_ids, recipe.build_args))
            try:
                self.podman.build(
                    pinned,
                    context,
                    tags=[reference],
                    labels={LABEL_RECIPE: digest, LABEL_NAME: name},
                    build_args=recipe.build_args,
                    ca_bundle=self.ca_bundle,
                    log=log,
                    timeout=self.build_timeout_s,
                    pull=False,  # every image it reads is here (pinned by id)
                )
            except ImageError as exc:
                self._remove_partial(name, digest)
                raise ImageError(f"{where}: building image {reference} failed (log: {log}):\n{exc}") from exc
            except Stopped:  # the build was killed: what it committed goes, as after a failure
                self._remove_partial(name, digest)
                raise
        # The build read the context as it was during the build: a file changed meanwhile (a checkout
        # of the context's repository) went into an image labelled with the digest of the old files,
        # which later runs of the old recipe then used.
        if recipe_digest(containerfile, context, recipe.build_args, image_ids) != digest:
            self._remove_partial(name, digest)
            raise ImageError(
                f"{where}: the recipe (its Containerfile or a file of {str(context)!r}) changed while "
                f"image {reference} was built; the image was not kept: build again"
            )

    def _remove_partial(self, name: str, digest: str) -> None:
        """What a failed build of environment ``name`` left (intermediate images carry its labels):
        removed, so a failure creates nothing. Only images labelled with both: another environment
        with the same recipe (two repositories sharing one Containerfile) has the same digest, and
        its image, perhaps mounted under running sandboxes, is not this build's to remove."""
        for image in self.podman.images(label=f"{LABEL_RECIPE}={digest}", all_=True):
            if (image.get("Labels") or {}).get(LABEL_NAME) == name:
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
            # A lock per reference (its hash: the lock's name keeps 32 characters, which every
            # docker.io/jyangballin/swesmith.x86_64.<repo> shares, and would make pulls wait in turn).
            with self._locked(hashlib.sha256(reference.encode()).hexdigest()):
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
        if self._made_from(reference, digest) is None:
            with self._locked(digest):
                if self._made_from(reference, digest) is None:
                    self._mmdebstrap(name, recipe, digest, reference, where)
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

    def _mmdebstrap(self, name: str, recipe: ImageRecipe, digest: str, reference: str, where: str) -> None:
        assert recipe.debian is not None  # invariant: the caller checked the kind
        self.podman.reap_orphans()  # as in ``_build``
        make_debian_base(
            self.podman,
            recipe.debian,
            reference,
            labels={LABEL_RECIPE: digest, LABEL_NAME: name},
            log=self.folder / "logs" / f"{slug(name)}-{digest[:16]}.log",
            tmp_root=self.folder / "tmp",
            timeout_s=self.build_timeout_s,
            where=where,
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
            with self._mounting(pruning=False):  # not while a prune removes images
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
        if not self.exists:
            return []
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
        """Remove harnessrl's images whose id is not in ``keep`` and that no process has mounted (a
        run is using it), then dangling layers and the build logs of images no longer here (not a
        running build's); ``keep`` None removes every image, mounted or not.
        Returns what was removed, what was kept because it is in use, and the bytes freed."""
        self.podman.reap_orphans()  # a killed process's build holds nothing in use
        if not self.exists:
            return {"removed": [], "in_use": [], "freed_bytes": 0, "store_bytes": 0}
        before = folder_bytes(self.podman.graphroot)
        # No run mounts an image from the look at the mounts to the last removal (``_mounting``).
        with self._mounting(pruning=True):
            self._mounts.give_back_stale()  # an image mounted only by a run that was killed is not in use
            mounted = self.podman.mounted_images() if keep is not None else set()
            removed, in_use = [], []
            for row in self.list():
                if keep is not None and row["id"] in keep:
                    continue
                if row["id"] in mounted:
                    in_use.append({"name": row["name"], "id": row["id"][:12]})
                    continue
                if self.podman.remove(row["id"]):
                    removed.append({"name": row["name"], "id": row["id"][:12]})
        self.podman.prune_dangling()
        logs_freed = self._prune_logs()
        with self._lock:
            self._roots = {k: v for k, v in self._roots.items() if keep is not None and k in keep | mounted}
        after = folder_bytes(self.podman.graphroot)
        return {
            "removed": removed,
            "in_use": in_use,
            "freed_bytes": max(0, before - after) + logs_freed,
            "store_bytes": after,
        }

    def _prune_logs(self) -> int:
        """Remove the build logs (``logs/<name>-<digest[:16]>.log``) of images no longer here, but
        not one a build is writing (its digest's lock held): one log per build stayed for good, the
        store's one growth that prune never gave back. Returns the bytes freed."""
        logs = self.folder / "logs"
        if not logs.is_dir():
            return 0
        here = {f"{slug(row['name'])}-{row['recipe'][:16]}.log" for row in self.list()}
        freed = 0
        for log in logs.glob("*.log"):
            if log.name in here:
                continue
            digest16 = log.name.removesuffix(".log").rpartition("-")[2]
            with self._unless_building(digest16) as idle:
                if idle:  # removed holding the lock: a build starting now writes a log of its own
                    with contextlib.suppress(OSError):
                        size = log.stat().st_size
                        log.unlink()
                        freed += size
        return freed

    @contextlib.contextmanager
    def _unless_building(self, digest16: str) -> Iterator[bool]:
        """Hold the build locks of the digests starting ``digest16`` if none is held (yields True),
        else yield False at once: a build of one goes on."""
        held: list[Any] = []
        try:
            for lock in sorted((self.folder / "locks").glob(f"{digest16}*.lock")):
                fh = lock.open("a")
                held.append(fh)
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
            yield True
        finally:
            for fh in held:
                fh.close()  # closing gives the lock back


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
