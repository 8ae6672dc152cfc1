"""Making one image of the store, under its build lock: ``podman build`` of a Containerfile whose
images are pinned by id, or a Debian base made with ``mmdebstrap`` (``debian.make_debian_base``).

A build writes its log to ``<store>/logs/`` and its scratch under ``<store>/tmp``, labels the image
with the recipe's digest and the environment's name (``naming``), and leaves nothing behind when it
fails or is stopped: an ``ImageError`` names the environment and shows the tail of the log.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from harnessrl.environments.config import DebianBase
from harnessrl.environments.debian import make_debian_base
from harnessrl.environments.naming import LABEL_NAME, LABEL_RECIPE, build_log_name
from harnessrl.environments.podman import ImageError, Podman
from harnessrl.environments.processes import Stopped, owner
from harnessrl.environments.recipes import pin_images, recipe_digest


def build_containerfile(
    podman: Podman,
    name: str,
    *,
    containerfile: Path,
    context: Path,
    build_args: Mapping[str, str],
    digest: str,
    reference: str,
    image_ids: Mapping[str, str],
    where: str,
    ca_bundle: str | None,
    timeout_s: float,
) -> None:
    """``podman build`` of a Containerfile whose images are pinned to the ids its digest
    recorded (``pin_images``): a tag moved after the digest was computed changes nothing."""
    log = podman.store / "logs" / build_log_name(name, digest)
    # A killed process's build of this image (its lock went with it) would write the same log and
    # tag the same image: killed first.
    podman.reap_orphans()
    tmp_root = podman.store / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root, prefix=f"recipe-{owner()}-") as tmp:
        pinned = Path(tmp) / containerfile.name
        pinned.write_text(pin_images(containerfile, image_ids, build_args))
        try:
            podman.build(
                pinned,
                context,
                tags=[reference],
                labels={LABEL_RECIPE: digest, LABEL_NAME: name},
                build_args=build_args,
                ca_bundle=ca_bundle,
                log=log,
                timeout=timeout_s,
                pull=False,  # every image it reads is here (pinned by id)
            )
        except ImageError as exc:
            remove_partial(podman, name, digest)
            raise ImageError(f"{where}: building image {reference} failed (log: {log}):\n{exc}") from exc
        except Stopped:  # the build was killed: what it committed goes, as after a failure
            remove_partial(podman, name, digest)
            raise
    # The build read the context as it was during the build: a file changed meanwhile (a checkout
    # of the context's repository) went into an image labelled with the digest of the old files,
    # which later runs of the old recipe then used.
    if recipe_digest(containerfile, context, build_args, image_ids) != digest:
        remove_partial(podman, name, digest)
        raise ImageError(
            f"{where}: the recipe (its Containerfile or a file of {str(context)!r}) changed while "
            f"image {reference} was built; the image was not kept: build again"
        )


def build_debian(
    podman: Podman,
    name: str,
    debian: DebianBase,
    *,
    digest: str,
    reference: str,
    where: str,
    timeout_s: float,
) -> None:
    """A Debian base made with ``mmdebstrap`` and imported as ``reference``."""
    podman.reap_orphans()  # as in ``build_containerfile``
    make_debian_base(
        podman,
        debian,
        reference,
        labels={LABEL_RECIPE: digest, LABEL_NAME: name},
        log=podman.store / "logs" / build_log_name(name, digest),
        tmp_root=podman.store / "tmp",
        timeout_s=timeout_s,
        where=where,
    )


def remove_partial(podman: Podman, name: str, digest: str) -> None:
    """What a failed build of environment ``name`` left (intermediate images carry its labels):
    removed, so a failure creates nothing. Only images labelled with both: another environment
    with the same recipe (two repositories sharing one Containerfile) has the same digest, and
    its image, perhaps mounted under running sandboxes, is not this build's to remove."""
    for image in podman.images(label=f"{LABEL_RECIPE}={digest}", all_=True):
        if (image.get("Labels") or {}).get(LABEL_NAME) == name:
            podman.remove(image.get("Id", ""))
