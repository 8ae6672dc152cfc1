"""Each task in its own environment: container images as sandbox roots (``docs/environments.md``).

``config`` says what an environment is and which one a task names (``[harness.environment]``);
``podman`` wraps the container tool (``processes`` kills what a timed-out call started);
``recipes`` checks and hashes build recipes; ``store`` builds, caches, lists and prunes images, with
its parts ``naming`` (tags, labels), ``locks`` (build and mounts locks), ``building``, ``pruning``
and ``mounts``; ``check`` asks whether an image can run the harness; ``resolve``
maps tasks to image roots (local runner) or references (Kubernetes) at run time. The sandbox side,
the image's filesystem as ``/``, is ``harnessrl.sandbox.rootfs``.
"""

from harnessrl.environments.config import HOST, DebianBase, EnvironmentConfig, ImageRecipe

__all__ = ["HOST", "DebianBase", "EnvironmentConfig", "ImageRecipe"]
