"""The harness brought into a task's image on Kubernetes: an init container copies it into a shared volume.

With per-task images (``docs/environments.md``) the Job's container runs the task's image, which
holds the repository's environment but not necessarily the harness. ``harness_image`` names an image
that does (harnessrl's venv, the Python it was made from, ``.harnesses/``...) and ``harness_paths``
the folders of it the harness needs, at the absolute paths they have there (a venv's scripts name
their interpreter by absolute path). ``inject_harness`` (pure: it edits the Job dict
``manifests.build_job_manifest`` is building) adds:

- an emptyDir volume ``harnessrl-harness``;
- an init container ``harnessrl-harness`` running ``harness_image`` that copies each path into the
  volume (``cp -RP``: links kept as links), under the same hardened security context as the harness
  (non-root, no capabilities, read-only root) and the harness container's cpu/memory/disk requests and
  limits (a ResourceQuota that demands limits checks init containers too); it needs ``sh`` and ``cp``;
- in the harness container, each path mounted read-only from the volume at its own path (``subPath``),
  so the task's image runs the harness exactly where it was installed.

The harness container keeps the task image's root read-only (``pod_security``), so the copied
harness can be neither edited by the agent nor seen by any other pod.
"""

from __future__ import annotations

import posixpath
from typing import Any

from harnessrl.controller.kubernetes.config import PodSecurityConfig
from harnessrl.controller.kubernetes.pod_security import container_security_context, init_resources
from harnessrl.errors import ConfigError

HARNESS_VOLUME = "harnessrl-harness"
HARNESS_CONTAINER = "harnessrl-harness"
HARNESS_MOUNT = "/harnessrl-harness"
# "$@" holds the paths; each is copied into the volume's folder of its index (0, 1, ...).
COPY_SCRIPT = 'i=0; for p in "$@"; do mkdir -p "$V/$i" && cp -RP "$p/." "$V/$i/" || exit 1; i=$((i+1)); done'


def inject_harness(
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    *,
    harness_image: str,
    paths: list[str],
    security: PodSecurityConfig,
) -> None:
    """Add the copying init container, the volume and the harness container's read-only mounts."""
    normalized = ["/" + posixpath.normpath(p).lstrip("/") if p.startswith("/") else p for p in paths]
    for path, norm in zip(paths, normalized, strict=True):
        if not path.startswith("/") or norm == "/":
            raise ConfigError(f"harness_paths: {path!r} must be an absolute folder other than /")
    paths = normalized
    script = COPY_SCRIPT.replace("$V", HARNESS_MOUNT)
    init: dict[str, Any] = {
        "name": HARNESS_CONTAINER,
        "image": harness_image,
        # Kubernetes expands $(VAR) in command strings; '$$' keeps every '$' literal.
        "command": [arg.replace("$", "$$") for arg in ("sh", "-c", script, HARNESS_CONTAINER, *paths)],
        "volumeMounts": [{"name": HARNESS_VOLUME, "mountPath": HARNESS_MOUNT}],
    }
    if security.enabled:
        init["securityContext"] = container_security_context(security)
    # As the seed copy's: without limits, a quota demanding them refused every Job with a task image.
    if resources := init_resources(container):
        init["resources"] = resources
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != HARNESS_VOLUME]
    pod_spec["volumes"] = [*volumes, {"name": HARNESS_VOLUME, "emptyDir": {}}]
    others = [c for c in pod_spec.get("initContainers") or [] if c.get("name") != HARNESS_CONTAINER]
    pod_spec["initContainers"] = [init, *others]
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") not in paths]
    mounts += [
        {"name": HARNESS_VOLUME, "mountPath": path, "subPath": str(i), "readOnly": True}
        for i, path in enumerate(paths)
    ]
    container["volumeMounts"] = mounts
