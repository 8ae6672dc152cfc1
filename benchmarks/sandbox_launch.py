"""What the bubblewrap sandbox costs per rollout attempt, side by side with no sandbox, in one run.

Each round launches the same harness command through the real local runner (cgroups, the gateway
relay, logs) twice, once with ``sandbox = "bwrap"`` and once with ``sandbox = "none"``, in
alternating order, and times launch-to-exit. Two commands: ``/bin/true`` (the launch cost alone) and
the venv's Python importing the ``openai`` SDK (what the main job's agent does before its first call).
The added time is then put against the main job's step: 32 rollouts a step run at once
(``examples/arithmetic``, ~30 s a step on 2 cores), so the share is ``added × 32 / 2 cores / 30 s``
— an upper bound, since the launches overlap with generation.

    .venv/bin/python benchmarks/sandbox_launch.py            # 20 rounds, ~1 min
    .venv/bin/python benchmarks/sandbox_launch.py --rounds 5
    .venv/bin/python benchmarks/sandbox_launch.py --main-job-steps 6   # + the main job itself, both ways (~12 min)

``--main-job-steps N`` also runs the README's main job (``examples/arithmetic``) for N steps with
``harness.sandbox = "bwrap"`` and again with ``"none"`` (no held-out evaluation), and compares the
median ``time/step_s`` of steps 2..N (step 1 includes warm-up): the sandbox's real share of a step.

Writes ``benchmarks/results/sandbox_launch.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from harnessrl.controller.base import Launch
from harnessrl.controller.local import LocalRunner
from harnessrl.sandbox.proxy import GatewayBridge

COMMANDS = {
    "true": ["/bin/true"],
    "python_import_openai": [sys.executable, "-c", "import openai"],
}
STEP_S, ROLLOUTS_PER_STEP, CORES = 30.0, 32, 2


async def one_attempt(runner: LocalRunner, folder: Path, argv: list[str], sandbox: str, n: int) -> float:
    attempt = folder / f"{sandbox}-{n}"
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
        timeout_s=60,
        gateway_port=18080,  # any port >= 1024: nothing listens behind the relay here
        sandbox=sandbox,
    )
    started = time.perf_counter()
    handle = await runner.launch(launch)
    exit_ = await handle.wait()
    elapsed = time.perf_counter() - started
    if exit_.exit_code != 0:
        raise RuntimeError(f"{sandbox} attempt failed: {exit_} {(attempt / 'stderr.log').read_text()[-500:]}")
    return elapsed


async def measure(rounds: int) -> dict:
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-") as tmp:
        async with GatewayBridge("127.0.0.1", 18080) as bridge:
            runner = LocalRunner(bridge_path=bridge.path)
            for name, argv in COMMANDS.items():
                times: dict[str, list[float]] = {"bwrap": [], "none": []}
                folder = Path(tmp) / name
                await one_attempt(runner, folder, argv, "bwrap", -1)  # warm caches for both
                for n in range(rounds):
                    order = ("bwrap", "none") if n % 2 == 0 else ("none", "bwrap")
                    for sandbox in order:
                        times[sandbox].append(await one_attempt(runner, folder, argv, sandbox, n))
                bwrap_ms = statistics.median(times["bwrap"]) * 1000
                none_ms = statistics.median(times["none"]) * 1000
                added_ms = bwrap_ms - none_ms
                results[name] = {
                    "bwrap_median_ms": round(bwrap_ms, 1),
                    "none_median_ms": round(none_ms, 1),
                    "added_ms": round(added_ms, 1),
                    "ratio_bwrap_to_none": round(bwrap_ms / none_ms, 3),
                    "share_of_a_main_job_step": round(
                        added_ms / 1000 * ROLLOUTS_PER_STEP / CORES / STEP_S, 4
                    ),
                    "rounds": rounds,
                }
                print(
                    f"{name:22s} bwrap {bwrap_ms:7.1f} ms  none {none_ms:7.1f} ms  added {added_ms:6.1f} ms "
                    f"({bwrap_ms / none_ms:.2f}x)  share of a 30 s step (32 rollouts, 2 cores): "
                    f"{results[name]['share_of_a_main_job_step']:.2%}"
                )
            await runner.aclose()
    return results


def main_job(steps: int) -> dict:
    """Median seconds per step of the main job with and without the sandbox, run one after the other."""
    root = Path(__file__).resolve().parents[1]
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="harnessrl-bench-main-") as tmp:
        for sandbox in ("bwrap", "none"):
            run_dir = Path(tmp) / sandbox
            argv = [sys.executable, "-m", "harnessrl", "train", str(root / "examples/arithmetic/train.toml")]
            for override in (
                f"trainer.steps={steps}",
                "trainer.eval_every=0",
                f"harness.sandbox={sandbox}",
                f"run.dir={run_dir}",
            ):
                argv += ["--set", override]
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            step_s = [r["time/step_s"] for r in rows if "time/step_s" in r][1:]
            medians[sandbox] = statistics.median(step_s)
            print(f"main job, sandbox={sandbox}: median {medians[sandbox]:.1f} s/step over steps 2..{steps}")
    share = medians["bwrap"] / medians["none"] - 1
    print(f"main job: the sandbox adds {share:+.1%} per step")
    return {
        "bwrap_median_step_s": round(medians["bwrap"], 2),
        "none_median_step_s": round(medians["none"], 2),
        "added_share_of_a_step": round(share, 4),
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--main-job-steps", type=int, default=0, help="also time the main job (0: skip)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sandbox_launch.json"))
    args = parser.parse_args()
    results = asyncio.run(measure(args.rounds))
    if args.main_job_steps:
        results["main_job"] = main_job(args.main_job_steps)
    payload = {
        "benchmark": "sandbox_launch",
        "results": results,
        "step_model": {"step_s": STEP_S, "rollouts_per_step": ROLLOUTS_PER_STEP, "cores": CORES},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
