"""A Debian base image made with ``mmdebstrap`` and imported into the store (``[images.X] debian``).

``make_debian_base`` runs mmdebstrap into a tar and ``podman import``s it. As root, mmdebstrap mounts
``/proc``, ``/sys`` and ``/dev`` into its chroot: it runs in a mount namespace of its own, so those
mounts go with its processes, and in a session of its own, so past ``timeout_s`` (or on Ctrl-C) it is
killed with every process it started (apt, dpkg in the chroot). The import has the same limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harnessrl.environments.config import DebianBase
from harnessrl.environments.podman import ImageError, Podman, PodmanTimeout, log_tail
from harnessrl.environments.processes import communicate, kill_tree, owner, tool_env


def make_debian_base(
    podman: Podman,
    debian: DebianBase,
    reference: str,
    *,
    labels: dict[str, str],
    log: Path,
    tmp_root: Path,
    timeout_s: float,
    where: str,
) -> None:
    """Make ``debian``'s root filesystem and import it as ``reference`` (with ``labels``); the build's
    output goes to ``log``, its scratch under ``tmp_root``. An ``ImageError`` naming ``where`` when
    mmdebstrap is missing, fails or runs past ``timeout_s``."""
    if shutil.which("mmdebstrap") is None:
        raise ImageError(f"{where}: mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    log.parent.mkdir(parents=True, exist_ok=True)
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root, prefix=f"debian-{owner()}-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        argv = ["mmdebstrap", f"--variant={debian.variant}"]
        if debian.include:
            argv.append("--include=" + ",".join(debian.include))
        # "--": the positional arguments are never read as options (a mirror of
        # "--setup-hook=..." would run a command as root).
        argv += ["--", debian.suite, str(tar), debian.mirror]
        # Marked (``processes.reap_orphans``): killed by the next build if this process is killed outright.
        env = {**os.environ, **tool_env(podman.store)}
        if os.geteuid() == 0 and shutil.which("unshare"):
            # Its /proc, /sys and /dev mounts in a mount namespace of its own go with its processes
            # when they are killed, and its temporary folders (in ours) are removed with this folder.
            argv = ["unshare", "--mount", "--propagation", "private", "--", *argv]
            env["TMPDIR"] = tmp
        with log.open("w") as out:
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # killed with every process it started
            )
            try:
                communicate(process, timeout_s)  # ends early when the interpreter exits
                returncode = process.returncode
            except subprocess.TimeoutExpired as exc:
                kill_tree(process)
                raise ImageError(f"{where}: mmdebstrap ran over {timeout_s:g} s (log: {log})") from exc
            except BaseException:  # Ctrl-C, or the interpreter exits (``processes.Exiting``)
                kill_tree(process)
                raise
        if returncode != 0:
            raise ImageError(
                f"{where}: making the Debian base {reference} failed (mmdebstrap exited "
                f"{returncode}; log: {log}):\n{log_tail(log)}"
            )
        # The import of a big root filesystem on a slow disk takes a while: it gets the build's own
        # limit (a fixed 600 s failed such a base, and a hung podman held the build 600 s whatever the
        # limit), and a timeout names the setting to raise.
        try:
            podman.import_tar(tar, reference, labels=labels, timeout=timeout_s)
        except PodmanTimeout as exc:
            raise ImageError(
                f"{where}: importing the Debian base {reference} ran over {timeout_s:g} s "
                "(raise [harness.environment] build_timeout_s)"
            ) from exc
