"""How the image store names and recognises its images: where the store lives, the tags of an
environment's images (``localhost/harnessrl/<name>:<digest[:16]>`` and ``:latest``), the labels a
build writes (the recipe's whole digest, the environment's name), and the check that an image under
a tag was made from the recipe it is asked for.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from harnessrl.environments.config import ImageRecipe, slug
from harnessrl.environments.podman import Podman

PREFIX = "localhost/harnessrl/"
LABEL_RECIPE = "io.harnessrl.recipe"
LABEL_NAME = "io.harnessrl.name"
#: A Containerfile's ``FROM`` naming one of harnessrl's own images (its group: the environment's slug).
OWN_BASE = re.compile(r"^(?:localhost/)?harnessrl/([a-z0-9][a-z0-9._-]*)(?::latest)?$")


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


def build_log_name(name: str, digest: str) -> str:
    """The file name of the build log of environment ``name``'s image of recipe ``digest``."""
    return f"{slug(name)}-{digest[:16]}.log"


def made_from(podman: Podman, reference: str, digest: str) -> str | None:
    """The id of the image ``reference`` names if it was made from the recipe ``digest`` (its
    label), else None. The tag keeps 16 hex digits of the digest: an image of another recipe
    whose digest starts alike (64 bits, a collision one can craft) is not this recipe's image."""
    if not podman.exists(reference):
        return None
    info = podman.inspect(reference)
    labels = info.get("Labels") or (info.get("Config") or {}).get("Labels") or {}
    return info["Id"] if labels.get(LABEL_RECIPE) == digest else None


def recipe_named(image_slug: str, recipes: Mapping[str, ImageRecipe]) -> str | None:
    """The configured environment whose image a ``FROM localhost/harnessrl/<image_slug>`` names."""
    return next((n for n in recipes if slug(n) == image_slug), None)
