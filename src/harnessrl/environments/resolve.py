"""Tasks to environments at run time: ``Environments`` gives each task its image root (local runner) or
image reference (Kubernetes), building and checking each image once per process.

``check_tasks`` is the pre-flight the entry points run before anything is created (``harnessrl
rollout``, ``train``, ``data calibrate``): every environment the tasks name is built or found, mounted,
and checked to run the harness (``check.harness_problems``); a problem is a ``ConfigError`` naming
the task, the image and what is missing. The controller asks again per rollout (``root_for``), which
is a dictionary lookup once the pre-flight ran, and an image that fails there (removed meanwhile)
is an infrastructure failure with the same message. ``close()`` gives the image mounts back when the
run ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.environments.check import harness_problems
from harnessrl.environments.config import HOST, EnvironmentConfig
from harnessrl.environments.podman import ImageError, podman_problem
from harnessrl.environments.processes import Stopped, current_stop
from harnessrl.environments.store import BuiltImage, ImageStore, own_reference, slug
from harnessrl.errors import ConfigError
from harnessrl.sandbox.rootfs import ImageRoot
from harnessrl.tasks.fields import HIDDEN, get_field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HarnessNeeds:
    """What a harness needs of an image: its argv (first item checked) and the host paths mounted."""

    argv: tuple[str, ...]
    mounts: tuple[Path, ...] = ()


def task_label(task: dict[str, Any]) -> str:
    for key in ("task_id", "instance_id", "id"):
        if isinstance(task.get(key), str) and task[key]:
            return f"task {task[key]!r}"
    return "a task"


class Environments:
    """The environments of one run. ``config`` None: every task runs on the host (today's sandbox)."""

    def __init__(self, config: EnvironmentConfig | None, *, store: ImageStore | None = None):
        self.config = config
        self._store = store
        self._built: dict[str, BuiltImage] = {}
        self._roots: dict[str, ImageRoot] = {}
        self._checked: dict[tuple[str, HarnessNeeds], list[str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    @property
    def store(self) -> ImageStore:
        if self._store is None:
            assert self.config is not None  # invariant: only environments with a config build images
            self._store = ImageStore.from_config(self.config)
        return self._store

    def name_for(self, task: dict[str, Any]) -> str:
        if self.config is None:
            return HOST
        try:
            return self.config.name_for(task)
        except ValueError as exc:
            raise ConfigError(f"{task_label(task)}: harness.environment: {exc}") from exc

    def uses_images(self, tasks: Iterable[dict[str, Any]]) -> bool:
        return any(self.name_for(t) != HOST for t in tasks)

    @contextlib.contextmanager
    def _name_lock(self, name: str) -> Iterator[None]:
        """Hold ``name``'s lock (one build or mount of it at a time in this process). Work under a
        ``BuildStop`` that is stopped while it waits here (another rollout of this process building the
        same image) ends with ``Stopped`` instead of waiting out that build."""
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        stop = current_stop()
        if stop is None:
            with lock:
                yield
            return
        while not lock.acquire(timeout=0.2):
            if stop.stopped:
                raise Stopped(f"stopped while waiting for this process's other build of {name!r}")
        try:
            yield
        finally:
            lock.release()

    def built(self, name: str, *, where: str) -> BuiltImage:
        """The image of environment ``name`` (built or found once per process)."""
        assert self.config is not None  # invariant: HOST never reaches here
        with self._name_lock(name):
            if name not in self._built:
                try:
                    recipe = self.config.recipe_for(name)
                except ValueError as exc:
                    raise ConfigError(f"{where}: harness.environment: {exc}") from exc
                assert recipe is not None  # invariant: name is not HOST
                problem = podman_problem()
                if problem is not None:
                    raise ImageError(f"{where}: environment {name!r} needs podman: {problem}")
                self._built[name] = self.store.ensure(name, recipe, recipes=self.config.images, where=where)
            return self._built[name]

    def root(self, name: str, *, where: str) -> ImageRoot:
        built = self.built(name, where=where)
        with self._name_lock(name):
            # Mounted again if someone unmounted it meanwhile (harnessrl images prune, a reboot).
            if name not in self._roots or not os.path.ismount(self._roots[name].path):
                self._roots[name] = self.store.root(built)
            return self._roots[name]

    def close(self) -> None:
        """Unmount the images this run mounted (its sandboxes must have finished); a later ``root``
        mounts again."""
        with self._lock:
            self._roots.clear()
        if self._store is not None:
            self._store.close()

    def root_for(self, task: dict[str, Any]) -> ImageRoot | None:
        """The image root a task's sandboxes run on; None for the host."""
        name = self.name_for(task)
        if name == HOST:
            return None
        return self.root(name, where=f"{task_label(task)} (environment {name!r})")

    def reference_for(self, task: dict[str, Any]) -> str | None:
        """The image reference a cluster runs a task's harness in (Kubernetes); None for the host.
        A recipe's reference is its content-addressed tag, under ``registry`` when one is set (harnessrl
        does not push: copy the image there yourself, e.g. ``podman push``); a plain image reference
        is used as written."""
        name = self.name_for(task)
        if name == HOST:
            return None
        assert self.config is not None  # invariant: HOST otherwise
        try:
            recipe = self.config.recipe_for(name)
        except ValueError as exc:
            raise ConfigError(f"{task_label(task)}: harness.environment: {exc}") from exc
        assert recipe is not None  # invariant: name is not HOST
        if recipe.image is not None:
            return recipe.image
        built = self.built(name, where=f"{task_label(task)} (environment {name!r})")
        reference = own_reference(name, built.digest)
        if self.config.registry:
            return f"{self.config.registry.rstrip('/')}/harnessrl/{slug(name)}:{built.digest[:16]}"
        return reference

    def problems(self, root: ImageRoot, needs: HarnessNeeds) -> list[str]:
        """What stops ``root`` from running the harness (checked once per image and harness)."""
        assert self.config is not None  # invariant: only image roots are checked
        key = (root.image_id or str(root.path), needs)
        with self._lock:
            cached = self._checked.get(key)
        if cached is None:
            cached, notes = harness_problems(
                root, list(needs.argv), host_harness=self.config.harness == "host", mounts=needs.mounts
            )
            for note in notes:
                log.info("image %s: %s (not needed by most harnesses)", root.name, note)
            with self._lock:
                self._checked[key] = cached
        return cached

    def require(self, task: dict[str, Any], needs: HarnessNeeds) -> ImageRoot | None:
        """The task's image root, refusing (``ConfigError``) an image that cannot run the harness."""
        root = self.root_for(task)
        if root is None:
            return None
        problems = self.problems(root, needs)
        if problems:
            name = self.name_for(task)
            raise ImageError(
                f"{task_label(task)}: image {root.name} (environment {name!r}) cannot run the harness "
                f"{self._how()}: " + "; ".join(problems)
            )
        return root

    def _how(self) -> str:
        assert self.config is not None  # invariant: called for image roots only
        if self.config.harness == "host":
            return 'mounted from this machine (harness.environment.harness = "host")'
        return 'it should bring (harness.environment.harness = "image")'

    def _names_one(self, task: dict[str, Any]) -> bool:
        """Whether ``task`` has the environment field (not absent, not empty)."""
        if self.config is None:
            return True
        try:
            value = get_field(task, self.config.field)
        except KeyError:
            return False
        return value is not None and value != ""

    def _refuse_unnamed(self, count: int, task: dict[str, Any]) -> None:
        """Refuse a set in which no task has the environment field and the default is the host: every
        task would run on the host, not in the images the section configures (a misspelt ``field``:
        SWE-smith records name theirs in ``image_name``), and score wrong with no message."""
        assert self.config is not None  # invariant: _names_one is True without a config
        if (self.config.default or HOST) != HOST:
            return
        fields = sorted(k for k in task if isinstance(k, str) and k != HIDDEN)
        shown_fields = ", ".join(fields[:20]) + (" ..." if len(fields) > 20 else "")
        raise ConfigError(
            f"harness.environment.field is {self.config.field!r}, but none of the {count} task(s) has "
            f"that field (absent or empty in every one; {task_label(task)} has: {shown_fields or 'none'}), "
            "so every task would run on the host, not in an image: set harness.environment.field to "
            "the task field that names the image (e.g. image_name for SWE-smith records), set "
            'harness.environment.default, name "host" in the tasks meant for the host, or remove '
            "[harness.environment] to run every task on the host"
        )

    def check_tasks(
        self,
        tasks: Iterable[dict[str, Any]],
        needs: HarnessNeeds,
        *,
        whole: Iterable[dict[str, Any]] | None = None,
    ) -> dict[str, int]:
        """The pre-flight: every environment the tasks name exists (or is built) and can run the
        harness. Returns how many tasks use each environment. A set in which no task has the
        environment field while the default is the host is refused (``_refuse_unnamed``); a set mixing
        tasks with and without it is not. ``whole``: the set ``tasks`` are part of (a resumed
        calibration checks only the tasks left): the field is looked for there."""
        counts: dict[str, int] = {}
        first: dict[str, dict[str, Any]] = {}
        named = 0  # tasks whose field names an environment (host included)
        for task in tasks:
            name = self.name_for(task)
            counts[name] = counts.get(name, 0) + 1
            first.setdefault(name, task)
            named += self._names_one(task)
        if counts and not named and not (whole is not None and any(map(self._names_one, whole))):
            self._refuse_unnamed(sum(counts.values()), next(iter(first.values())))
        for name, task in first.items():
            if name != HOST:
                self.require(task, needs)
        return counts
