"""What per-task images cost, measured side by side in one run (docs/environments.md).

1. **Start overhead per attempt.** The same command launched through the real local runner (cgroups,
   the gateway relay, logs) with the host's system as the sandbox root and with a task image as the
   root (bubblewrap over ``podman image mount``), alternating, median launch-to-exit; and, for the
   choice of how to run an image at all, the same command with ``podman run`` (runc, no network).
   Commands: ``/bin/true`` (the launch alone) and the venv's Python importing ``openai`` (what a
   harness does before its first call).
2. **Getting an image's root on disk.** ``podman image mount`` (what harnessrl uses) against
   ``skopeo copy`` to an OCI layout + ``umoci unpack`` (a private copy of the filesystem), time and bytes.
3. **Builds.** A project image of ``examples/swe`` built cold (its pip step re-run: a new token in a
   throwaway copy of the recipe) and found cached (``ImageStore.ensure`` of the unchanged recipe); the
   Debian base's time is what ``harnessrl images build`` printed when it was made (``--base`` makes it
   again, ~3 min).
4. **Disk.** Each image's size as podman reports it, and the whole store (layers shared once).

    .venv/bin/python benchmarks/image_environments.py              # ~3 min
    .venv/bin/python benchmarks/image_environments.py --rounds 10 --base

Writes ``benchmarks/results/image_environments.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harnessrl.config import load_raw_config, resolve_relative_paths
from harnessrl.controller.base import Launch
from harnessrl.controller.local import LocalRunner
from harnessrl.environments.config import EnvironmentConfig, ImageRecipe
from harnessrl.environments.resolve import Environments
from harnessrl.environments.store import folder_bytes
from harnessrl.sandbox.proxy import GatewayBridge

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "swe"
IMAGE = "swe/toolz"
COMMANDS = {"true": ["/bin/true"], "python_import_openai": [sys.executable, "-c", "import openai"]}


def example_environments() -> Environments:
    raw = resolve_relative_paths(load_raw_config(str(EXAMPLE / "train.toml"), [], env={}), EXAMPLE)
    return Environments(EnvironmentConfig.model_validate(raw["harness"]["environment"]))


async def one_attempt(runner: LocalRunner, folder: Path, argv: list[str], root, n: int, name: str) -> float:
    attempt = folder / f"{name}-{n}"
    workspace = attempt / "workspace"
    workspace.mkdir(parents=True)
    launch = Launch(
        rollout_id=f"bench-{n}",
        attempt=0,
        argv=argv,
        env={"HOME": str(attempt / "home")},
        task={},
        files={},
        workspace=workspace,
        cwd=workspace,
        log_dir=attempt,
        timeout_s=120,
        gateway_port=18081,
        root=root,
    )
    started = time.perf_counter()
    handle = await runner.launch(launch)
    exit_ = await handle.wait()
    elapsed = time.perf_counter() - started
    if exit_.exit_code != 0:
        raise RuntimeError(f"{name}: {exit_} {(attempt / 'stderr.log').read_text()[-500:]}")
    return elapsed


def podman_run(environments: Environments, image_id: str, argv: list[str], mounts: list[str]) -> float:
    # root inside (the image's /root, on the way to the host Python's path, is 0700): start cost is the same
    args = ["run", "--rm", "--network=none", "--read-only"]
    for path in mounts:
        args += ["-v", f"{path}:{path}:ro"]
    started = time.perf_counter()
    environments.store.podman.run(*args, image_id, *argv, timeout=300)
    return time.perf_counter() - started


async def launches(rounds: int, environments: Environments) -> dict:
    root = environments.root(IMAGE, where="benchmark")
    python_mounts = sorted({str(Path(sys.prefix)), str(Path(sys.base_prefix)), str(ROOT / "src")})
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-images-") as tmp:
        async with GatewayBridge("127.0.0.1", 18081) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            for name, argv in COMMANDS.items():
                folder = Path(tmp) / name
                times: dict[str, list[float]] = {"host_root": [], "image_root": [], "podman_run": []}
                await one_attempt(runner, folder, argv, None, -1, "warm-host")
                await one_attempt(runner, folder, argv, root, -1, "warm-image")
                podman_run(environments, root.image_id, argv, python_mounts)
                for n in range(rounds):
                    order = ("host_root", "image_root") if n % 2 == 0 else ("image_root", "host_root")
                    for kind in order:
                        times[kind].append(
                            await one_attempt(
                                runner, folder, argv, root if kind == "image_root" else None, n, kind
                            )
                        )
                    times["podman_run"].append(podman_run(environments, root.image_id, argv, python_mounts))
                medians = {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()}
                results[name] = {
                    **{f"{k}_median_ms": v for k, v in medians.items()},
                    "image_root_added_ms": round(medians["image_root"] - medians["host_root"], 1),
                    "podman_run_added_ms": round(medians["podman_run"] - medians["host_root"], 1),
                    "rounds": rounds,
                }
                print(f"{name:22s} {json.dumps(results[name])}")
            await runner.aclose()
    return results


def root_on_disk(environments: Environments) -> dict:
    """podman image mount vs skopeo copy + umoci unpack, for the same image."""
    built = environments.built(IMAGE, where="benchmark")
    podman = environments.store.podman
    podman.unmount(built.image_id)
    started = time.perf_counter()
    mounted = podman.mount(built.image_id)
    mount_s = time.perf_counter() - started
    out: dict = {"podman_image_mount_s": round(mount_s, 3), "podman_image_mount_extra_bytes": 0}
    if shutil.which("skopeo") and shutil.which("umoci"):
        with tempfile.TemporaryDirectory(
            prefix="harnessrl-bench-umoci-", dir=environments.store.folder
        ) as tmp:
            started = time.perf_counter()
            env = podman.env()
            subprocess.run(
                ["skopeo", "copy", f"containers-storage:{built.reference}", f"oci:{tmp}/oci:img"],
                env=env,
                check=True,
                capture_output=True,
            )
            copied = time.perf_counter()
            subprocess.run(
                ["umoci", "unpack", "--image", f"{tmp}/oci:img", f"{tmp}/bundle"],
                check=True,
                capture_output=True,
            )
            done = time.perf_counter()
            out.update(
                skopeo_copy_s=round(copied - started, 3),
                umoci_unpack_s=round(done - copied, 3),
                umoci_total_s=round(done - started, 3),
                umoci_extra_bytes=folder_bytes(Path(tmp)),
            )
    out["mounted_at"] = str(mounted)
    return out


def builds(environments: Environments, base: bool) -> dict:
    """A project image cold (its pip step re-run) and cached; optionally the Debian base again."""
    store = environments.store
    config = environments.config
    assert config is not None  # invariant: example_environments() has a config
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-build-") as tmp:
        context = Path(tmp) / "ctx"
        shutil.copytree(EXAMPLE / "images" / "toolz", context)
        text = (context / "Containerfile").read_text()
        token = secrets.token_hex(6)
        # A new first step after FROM: every later step (the pip install) runs again: a cold build.
        (context / "Containerfile").write_text(
            text.replace("\nCOPY ", f"\nRUN echo {token} > /bench-token\nCOPY ", 1)
        )
        recipe = ImageRecipe(containerfile=str(context / "Containerfile"))
        cold = store.ensure("bench-cold", recipe, recipes=config.images)
        cached = store.ensure("bench-cold", recipe, recipes=config.images)
        store.podman.remove(cold.image_id)
        out.update(project_cold_s=cold.seconds, project_cached_s=cached.seconds, cold_built=cold.built)
        out["cached_built"] = cached.built
    if base:
        spec = config.images["swe-base"]
        assert spec.debian is not None  # invariant: the example's base is a Debian recipe
        again = spec.model_copy(
            update={"debian": spec.debian.model_copy(update={"include": [*spec.debian.include, "less"]})}
        )
        made = store.ensure("bench-base", again, recipes=config.images)
        out["debian_base_cold_s"] = made.seconds
        store.podman.remove(made.image_id)
    return out


def disk(environments: Environments) -> dict:
    usage = environments.store.disk_usage()
    return {
        "store_bytes": usage["store_bytes"],
        "images": {
            row["name"]: row["size_bytes"] for row in usage["images"] if not row["name"].startswith("bench")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--base", action="store_true", help="also make a Debian base again (~3 min)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "image_environments.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    environments = example_environments()
    for name in environments.config.images:  # type: ignore[union-attr]
        environments.built(name, where="benchmark")
    results = {
        "launch": asyncio.run(launches(args.rounds, environments)),
        "root_on_disk": root_on_disk(environments),
        "builds": builds(environments, args.base),
        "disk": disk(environments),
    }
    print(json.dumps(results, indent=2))
    payload = {
        "benchmark": "image_environments",
        "results": results,
        "image": IMAGE,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cores": os.cpu_count(),
            # other jobs share these 2 cores: the 1-minute load average before and after the run
            "load_average_1m": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
