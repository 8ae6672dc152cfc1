"""What a task's environment is: the ``[harness.environment]`` settings and which environment a task names.

An *environment* is a container image whose filesystem becomes the sandbox's root for a task's
harness and its command evaluator (``docs/environments.md``). It is one of:

- an **image** that exists (``image = "docker.io/swebench/sweb.eval.x86_64.foo:latest"``): used as
  it is, pulled first only with ``pull = true``;
- a **build recipe** (``containerfile`` and its ``context`` folder), built on demand with podman and
  cached by the recipe's content;
- a **Debian base** made with mmdebstrap (``debian = {suite, variant, include}``): what recipes start
  ``FROM`` where no registry is reachable.

Images are per repository, not per task: the task's own state (its commit, the files placed, the
squashed history) is applied to the workspace by the controller as before, so nothing hidden is in
an image. Which environment a task runs in is named by one of its visible fields (``field``: by
default ``environment``; ``image_name`` for SWE-smith records; ``repo`` to key recipes by
repository): the value is a key of ``images``, else an image reference. ``"host"`` (and an absent or
empty field with no ``default``) is today's environment: the host's system folders.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harnessrl.tasks.fields import HIDDEN, get_field

HOST = "host"  # the environment of a task that names none: the host's own system folders
# An image reference as podman takes it: [registry/]name[:tag][@digest], lower-case name. Matched
# whole (``fullmatch``: a "$" let a trailing newline through) and in ASCII (a tag is [A-Za-z0-9_.-]).
_REFERENCE = re.compile(
    r"[a-z0-9]+(?:(?:[._]|__|-+|/)[a-z0-9]+)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?", re.ASCII
)
_PORTED = re.compile(r"^[a-z0-9][a-z0-9.-]*(?::\d+)?/")
_NAME_MAX = 255  # Docker's limit on a reference's name (registry and path, without tag or digest)


def slug(name: str) -> str:
    """An environment name as the last part of an image name (``swe/inflection`` -> ``swe-inflection``)."""
    out = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    return out or "env"


def is_reference(value: str) -> bool:
    """Whether ``value`` looks like an image reference (``name``, ``registry:5000/a/b:tag``...)."""
    rest = _PORTED.sub("", value, count=1) if "/" in value else value
    if not _REFERENCE.fullmatch(rest):
        return False
    head, slash, last = value.partition("@")[0].rpartition("/")
    return len(head + slash + last.partition(":")[0]) <= _NAME_MAX


def shown(value: str, limit: int = 100) -> str:
    """``value`` as an error message shows it: quoted, and cut when it is long."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"


class DebianBase(BaseModel):
    """A Debian root filesystem made by ``mmdebstrap`` and imported as an image."""

    model_config = ConfigDict(extra="forbid")

    suite: str = Field(default="bookworm", pattern=r"^[a-z][a-z0-9.-]*$")
    variant: Literal[
        "extract", "custom", "essential", "apt", "minbase", "buildd", "important", "standard"
    ] = "minbase"
    include: list[str] = Field(default_factory=list, description="more Debian packages")
    mirror: str = Field(
        default="http://deb.debian.org/debian",
        pattern=r"^(https?|file)://[^\s]+$",
        description="the Debian mirror to use (http://, https:// or file://)",
    )

    @field_validator("include")
    @classmethod
    def _package_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]+(?::[a-z0-9]+)?(?:=[\w.:~+-]+)?", name, re.ASCII):
                raise ValueError(f"{name!r} is not a Debian package name")
        return value


class ImageRecipe(BaseModel):
    """One named environment: exactly one of ``image``, ``containerfile`` (+ ``context``) or ``debian``."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(default=None, description="an existing image reference")
    containerfile: str | None = Field(default=None, description="a build recipe (Containerfile/Dockerfile)")
    context: str | None = Field(
        default=None, description="the build's context folder (default: the Containerfile's folder)"
    )
    build_args: dict[str, str] = Field(default_factory=dict, description="--build-arg NAME=value")
    debian: DebianBase | None = Field(default=None, description="a base made with mmdebstrap")

    @model_validator(mode="after")
    def _one_kind(self) -> ImageRecipe:
        kinds = [k for k in ("image", "containerfile", "debian") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"set exactly one of image, containerfile or debian (got {kinds or 'none'})")
        if self.image is not None and not is_reference(self.image):
            raise ValueError(f"image {self.image!r} is not an image reference")
        if (self.context is not None or self.build_args) and self.containerfile is None:
            raise ValueError("context and build_args go with containerfile")
        return self

    @property
    def kind(self) -> str:
        return "image" if self.image else "containerfile" if self.containerfile else "debian"


class EnvironmentConfig(BaseModel):
    """``[harness.environment]``: where a task's harness and command evaluator run."""

    model_config = ConfigDict(extra="forbid")

    field: str = Field(
        default="environment",
        description="the task field naming its environment (a dotted path; never under hidden): "
        "environment, image_name (SWE-smith), repo (recipes per repository)...",
    )
    default: str | None = Field(
        default=None, description='environment of a task whose field is absent or empty; None = "host"'
    )
    images: dict[str, ImageRecipe] = Field(
        default_factory=dict, description="named environments: a task's field value -> image or recipe"
    )
    harness: Literal["host", "image"] = Field(
        default="host",
        description='"host": the harness\'s install (venv, its Python, .harnesses/, mounts) is mounted '
        'read-only from this machine at the same paths; "image": the image brings the harness',
    )
    pull: bool = Field(
        default=False, description="pull an image reference that is not here (needs a registry)"
    )
    store: str | None = Field(
        default=None, description="container storage folder; default $HARNESSRL_CACHE_DIR/containers"
    )
    build_ca_bundle: str | None = Field(
        default="/etc/ssl/certs/ca-certificates.crt",
        description="host CA bundle mounted at the same path in build steps only (never in the image); "
        "null: none",
    )
    # At most a week: ``inf`` (TOML's "no limit") reached a pull's wait as an OverflowError traceback.
    build_timeout_s: float = Field(default=1800.0, gt=0, le=7 * 24 * 3600)
    registry: str | None = Field(
        default=None,
        description="Kubernetes: where built recipes are pushed/pulled from (prefix of their reference)",
    )

    @field_validator("field")
    @classmethod
    def _visible(cls, value: str) -> str:
        if value == HIDDEN or value.startswith(HIDDEN + "."):
            raise ValueError(f"{value!r} is evaluator-only data: the environment must be a visible field")
        return value

    @field_validator("registry")
    @classmethod
    def _registry_prefix(cls, value: str | None) -> str | None:
        # Checked here: a prefix such as "https://registry:5000" made every Job's image an invalid
        # reference, each rollout then failing on the cluster (InvalidImageName) instead of the run
        # refusing to start.
        if not value:
            return value  # "" as None: no registry
        host, slash, path = value.rstrip("/").partition("/")
        # A host name may have capitals (Docker's grammar); the path may not.
        if not is_reference(f"{host.lower()}{slash}{path}/harnessrl/env:0123456789abcdef"):
            raise ValueError(
                f"{shown(value)} is not a registry prefix of image references (host[:port][/path], "
                "lower case, no scheme): e.g. registry.example.com:5000/rl"
            )
        return value

    @field_validator("images")
    @classmethod
    def _names(cls, value: dict[str, ImageRecipe]) -> dict[str, ImageRecipe]:
        for name in value:
            if name == HOST or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}", name):
                raise ValueError(f"images: {name!r} is not a usable environment name")
            if not is_reference(f"localhost/harnessrl/{slug(name)}:latest"):
                raise ValueError(
                    f"images: {name!r} would make the image name localhost/harnessrl/{slug(name)}, "
                    "which podman refuses (no '..', '___' or '.-'); rename it"
                )
        # Two names with one image name would share localhost/harnessrl/<slug>:latest.
        by_slug: dict[str, str] = {}
        for name in value:
            other = by_slug.setdefault(slug(name), name)
            if other != name:
                raise ValueError(
                    f"images: {other!r} and {name!r} would share the image name "
                    f"localhost/harnessrl/{slug(name)}; rename one"
                )
        return value

    @model_validator(mode="after")
    def _default_usable(self) -> EnvironmentConfig:
        default = self.default
        if default and default != HOST and default not in self.images and not is_reference(default):
            raise ValueError(
                f"default: {shown(default)} is neither an environment configured in images nor an image "
                "reference"
            )
        return self

    def name_for(self, task: dict[str, Any]) -> str:
        """The environment a task names: a key of ``images``, an image reference, or ``"host"``."""
        try:
            value = get_field(task, self.field)
        except KeyError:
            value = None
        if value is None or value == "":
            value = self.default or HOST
        if not isinstance(value, str):
            raise ValueError(
                f"task field {self.field!r} must be a string naming an environment, got {value!r}"
            )
        if value != HOST and value not in self.images and not is_reference(value):
            raise ValueError(
                f"task field {self.field!r} is {shown(value)}: neither an environment configured in "
                "harness.environment.images nor an image reference"
            )
        return value

    def recipe_for(self, name: str) -> ImageRecipe | None:
        """The recipe of an environment name; None for the host. A name that is not configured is
        an image reference (a SWE-smith ``image_name``), refused when it is not one."""
        if name == HOST:
            return None
        if name in self.images:
            return self.images[name]
        if not is_reference(name):
            raise ValueError(
                f"environment {shown(name)} is neither configured in harness.environment.images nor an "
                "image reference"
            )
        return ImageRecipe(image=name)
