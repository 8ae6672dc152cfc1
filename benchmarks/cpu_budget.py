"""The main job's CPU budget: memory of its process tree, time per step, and how close the trainer and
the embedded engine come to what this CPU can do.

What is measured, for one source tree (``--code``, default this checkout) or for the commit before a
change and this checkout one after the other (``--before REF``: a ``git worktree`` of REF in
``/tmp/cpu-before``, removed afterwards), each number next to the 1-minute load average when it was
taken (the machine may be shared; a loaded machine makes every time longer):

- ``gemm``: the machine's float32 (and bfloat16) matrix-product rate, GFLOP/s, from a square
  2048 x 2048 product and from the trainer's own shapes (tokens x 576 @ 576 x 1536), best of a few;
- ``bandwidth``: memory bandwidth, GB/s, from copying a 512 MB tensor (what bounds decode);
- ``decode``: the embedded engine's ``BatchedDecoder`` decode steps at batch 1 and 32 (prompt of
  ``--decode-prompt`` tokens), tokens/s against the bound ``batch * bandwidth / (weight bytes + KV
  bytes read per step)``;
- ``job``: ``harnessrl train examples/arithmetic/train.toml`` as users start it (a subprocess, with
  ``run.dir`` in a scratch folder, ``trainer.steps = --steps``, ``engine.dtype``/``trainer.autocast`` from
  ``--dtype``), its process tree sampled every second from ``/proc``: peak summed RSS and PSS of the
  tree (PSS counts shared pages once) and, at the PSS peak, which processes hold it (``at_peak_tree_pss``:
  PSS/RSS summed by kind: the training process, sandbox launchers, ``bwrap``, the sandboxes' ``init``
  and the harnesses, and the training process's own ``smaps_rollup``), the tree's PSS every 5 s
  (``timeline_every_5s``), peak RSS of the training process (its ``VmHWM``), wall time
  from start to exit and per step (``time/step_s``, ``time/train_s``), the trainer's achieved FLOP
  rate ``6 * params * forward_tokens / train_s`` (the attention's FLOPs not counted: a lower bound)
  as a share of the measured GEMM rate, and the held-out rewards the run logged.

    .venv/bin/python benchmarks/cpu_budget.py --steps 20                 # this checkout
    .venv/bin/python benchmarks/cpu_budget.py --steps 3 --before HEAD~3  # before and after, one run
    .venv/bin/python benchmarks/cpu_budget.py --steps 2 --before A --after B --set trainer.eval_every=0
    .venv/bin/python benchmarks/cpu_budget.py --only gemm,decode         # no training job

Results go to ``benchmarks/results/cpu_budget.json`` (``before``/``after`` or ``current``), or to
``--out``: ``results/cpu_budget_20_steps.json`` is ``--steps 20 --decode-prompt 128`` of one checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "arithmetic" / "train.toml"
RESULTS = ROOT / "benchmarks" / "results" / "cpu_budget.json"
BEFORE_DIR = Path("/tmp/cpu-before")
STEPS = 16  # decode steps timed per batch size
AFTER_DIR = Path("/tmp/cpu-after")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_description() -> dict[str, Any]:
    flags: set[str] = set()
    name = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.partition(":")[2].strip()
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
    return {
        "model": name,
        "cores": os.cpu_count(),
        "amx": any(f.startswith("amx") for f in flags),
        "avx512_bf16": "avx512_bf16" in flags,
        "avx512f": "avx512f" in flags,
        "mem_total_gb": round(meminfo_kb("MemTotal") / 1e6, 1),
    }


def meminfo_kb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


# -- the machine -----------------------------------------------------------------------------------
def best_seconds(fn: Any, repeats: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure_gemm() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    shapes = {"square_2048": (2048, 2048, 2048), "trainer_mlp_1024x576x1536": (1024, 576, 1536)}
    for dtype in (torch.float32, torch.bfloat16):
        for label, (m, k, n) in shapes.items():
            a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            s = best_seconds(lambda a=a, b=b: a @ b, 5)
            out[f"{str(dtype).removeprefix('torch.')}_{label}_gflops"] = round(2 * m * k * n / s / 1e9, 1)
    out["float32_gflops"] = max(
        v for k, v in out.items() if k.startswith("float32_") and k.endswith("gflops")
    )
    out["load1"] = load1()
    return out


def measure_bandwidth() -> dict[str, Any]:
    import torch

    src = torch.ones(128 * 1024 * 1024)  # 512 MB
    dst = torch.empty_like(src)
    s = best_seconds(lambda: dst.copy_(src), 5)
    return {"copy_gb_s": round(2 * src.numel() * 4 / s / 1e9, 1), "load1": load1()}


def measure_decode(prompt_tokens: int, bandwidth_gb_s: float, gemm_gflops: float) -> dict[str, Any]:
    """Decode steps of the embedded engine's decoder on SmolLM2 in float32 at batch 1 and 32."""
    import torch
    from transformers import AutoModelForCausalLM

    from harnessrl.engines.decoder import BatchedDecoder
    from harnessrl.engines.models import resolve_model_dir

    model_dir = resolve_model_dir("smollm2")
    model = (
        AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval().requires_grad_(False)
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config
    kv_per_token = (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    )
    out: dict[str, Any] = {"weight_bytes": weight_bytes, "prompt_tokens": prompt_tokens}
    with torch.no_grad():
        for batch in (1, 32):
            decoder = BatchedDecoder(model, max_rows=batch, context_length=2048)
            decoder.prefill(0, list(range(100, 100 + prompt_tokens)), 0)
            decoder.ensure_capacity(batch, prompt_tokens + STEPS)
            for row in range(1, batch):  # the same prompt in every row: copied, not prefilled again
                decoder.move_row(0, row, prompt_tokens)
            tokens = torch.full((batch,), 200, dtype=torch.long)

            def run(decoder: Any = decoder, tokens: torch.Tensor = tokens) -> None:
                for i in range(STEPS):
                    decoder.decode(
                        tokens, torch.full((tokens.shape[0],), prompt_tokens + i, dtype=torch.long)
                    )

            s = best_seconds(run, 3)
            tok_s = batch * STEPS / s
            kv_read = batch * kv_per_token * (prompt_tokens + STEPS / 2)
            bound = batch * bandwidth_gb_s * 1e9 / (weight_bytes + kv_read)
            # A decode step of B rows also does 2 * params FLOPs per row: at batch 32 compute bounds it.
            compute = gemm_gflops * 1e9 / (2 * weight_bytes / 4)
            out[f"batch{batch}"] = {
                "tokens_per_s": round(tok_s, 1),
                "bandwidth_bound_tokens_per_s": round(bound, 1),
                "share_of_bound": round(tok_s / bound, 3),
                "compute_bound_tokens_per_s": round(compute, 1),
                "share_of_min_bound": round(tok_s / min(bound, compute), 3),
                "load1": load1(),
            }
            decoder.release()
    return out


# -- the main job ----------------------------------------------------------------------------------
def tree_pids(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def smaps_kb(pid: int) -> dict[str, int]:
    """``/proc/PID/smaps_rollup``'s fields in kB (``Rss``, ``Pss``, ``Pss_Anon``, ``Pss_File``...); {} if gone."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                out[key] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return out


def process_kind(pid: int, root: int) -> str:
    """What a process of the job's tree is, from its command line: the training process (``root``),
    a sandbox ``launcher`` (``harnessrl.sandbox.enter``), ``bwrap``, the sandbox's ``init`` (init.py),
    or a ``harness`` (anything else a sandbox runs: the agent)."""
    if pid == root:
        return "trainer"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    args = [a.decode(errors="replace") for a in argv if a]
    if "harnessrl.sandbox.enter" in args:
        return "launcher"
    if args and Path(args[0]).name == "bwrap":
        return "bwrap"
    if any(a.endswith("/init.py") for a in args[:4]):
        return "init"
    return "harness"


def tree_memory(root: int) -> dict[str, Any]:
    """The tree's summed RSS and PSS now (kB), and the same by process kind (``process_kind``)."""
    kinds: dict[str, dict[str, int]] = {}
    rss = pss = 0
    trainer: dict[str, int] = {}
    for pid in tree_pids(root):
        fields = smaps_kb(pid)
        if not fields:
            continue
        kind = process_kind(pid, root)
        if kind == "trainer":
            trainer = fields
        k = kinds.setdefault(kind, {"processes": 0, "rss_kb": 0, "pss_kb": 0, "max_pss_kb": 0})
        k["processes"] += 1
        k["rss_kb"] += fields.get("Rss", 0)
        k["pss_kb"] += fields.get("Pss", 0)
        k["max_pss_kb"] = max(k["max_pss_kb"], fields.get("Pss", 0))
        rss += fields.get("Rss", 0)
        pss += fields.get("Pss", 0)
    return {"rss_kb": rss, "pss_kb": pss, "kinds": kinds, "trainer": trainer}


def _gb(kb: int) -> float:
    return round(kb / 1e6, 3)


def run_job(code: Path, steps: int, dtype: str, work: Path, extra: list[str]) -> dict[str, Any]:
    run_dir = work / "run"
    argv = [sys.executable, "-m", "harnessrl", "train", str(code / "examples/arithmetic/train.toml")]
    overrides = [
        f"run.dir={run_dir}",
        f"trainer.steps={steps}",
        "metrics.progress=false",
        "metrics.tensorboard=false",
    ]
    if dtype != "auto":
        overrides += [
            f"engine.dtype={dtype}",
            f"trainer.autocast={'bf16' if dtype == 'bfloat16' else 'none'}",
        ]
    for item in [*overrides, *extra]:
        argv += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(code / "src")}
    log(f"job: {' '.join(argv[2:])} (code {code})")
    started = time.monotonic()
    peak = {"tree_rss_kb": 0, "tree_pss_kb": 0, "train_hwm_kb": 0, "processes": 0}
    at_pss_peak: dict[str, Any] = {}
    timeline: list[list[float]] = []  # [s since start, tree PSS GB, trainer PSS GB, processes, load1]
    loads = []
    metrics_file = run_dir / "metrics.jsonl"
    with open(work / "job.log", "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(code))
        while proc.poll() is None:
            now = tree_memory(proc.pid)
            processes = sum(k["processes"] for k in now["kinds"].values())
            if now["rss_kb"] > peak["tree_rss_kb"]:
                peak["tree_rss_kb"], peak["processes"] = now["rss_kb"], processes
                peak["train_rss_kb_at_peak"] = status_kb(proc.pid, "VmRSS")
            if now["pss_kb"] > peak["tree_pss_kb"]:
                peak["tree_pss_kb"] = now["pss_kb"]
                logged = metrics_file.read_text().count("\n") if metrics_file.exists() else 0
                at_pss_peak = {
                    "s_since_start": round(time.monotonic() - started),
                    "metrics_rows_logged": logged,
                    "by_kind": {
                        kind: {
                            "processes": k["processes"],
                            "pss_gb": _gb(k["pss_kb"]),
                            "rss_gb": _gb(k["rss_kb"]),
                            "largest_pss_gb": _gb(k["max_pss_kb"]),
                        }
                        for kind, k in sorted(now["kinds"].items())
                    },
                    "trainer_smaps_gb": {
                        key: _gb(now["trainer"].get(key, 0))
                        for key in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Anonymous", "Swap")
                    },
                }
            peak["train_hwm_kb"] = max(peak["train_hwm_kb"], status_kb(proc.pid, "VmHWM"))
            loads.append(load1())
            trainer_pss = _gb(now["kinds"].get("trainer", {}).get("pss_kb", 0))
            since = round(time.monotonic() - started)
            timeline.append([since, _gb(now["pss_kb"]), trainer_pss, processes, loads[-1]])
            time.sleep(1.0)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(
            f"harnessrl train failed ({proc.returncode}):\n{(work / 'job.log').read_text()[-3000:]}"
        )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    trained = [r for r in rows if r.get("time/train_s") is not None]
    step_s = [r["time/step_s"] for r in trained]
    # the optimizer step alone where the run logs it (time/train_step_s), else the whole train phase
    train_s = [r.get("time/train_step_s", r["time/train_s"]) for r in trained]
    tokens = [r.get("policy/forward_tokens", 0.0) for r in trained]
    return {
        "steps": len(trained),
        "wall_s": round(wall, 1),
        "step_s": [round(s, 1) for s in step_s],
        "step_s_median": round(sorted(step_s)[len(step_s) // 2], 1) if step_s else None,
        "train_s": [round(s, 1) for s in train_s],
        "train_s_is": "time/train_step_s"
        if trained and "time/train_step_s" in trained[0]
        else "time/train_s",
        "forward_tokens": tokens,
        "peak_tree_rss_gb": round(peak["tree_rss_kb"] / 1e6, 2),
        "peak_tree_pss_gb": round(peak["tree_pss_kb"] / 1e6, 2),
        "processes_at_peak_rss": peak["processes"],
        "train_process_rss_at_tree_peak_gb": round(peak.get("train_rss_kb_at_peak", 0) / 1e6, 2),
        "peak_train_process_rss_gb": round(peak["train_hwm_kb"] / 1e6, 2),
        "at_peak_tree_pss": at_pss_peak,
        "timeline_every_5s": timeline[::5],  # [s, tree PSS GB, trainer PSS GB, processes, load1]
        "heldout": [[r["step"], r["heldout/success_rate"]] for r in rows if "heldout/success_rate" in r],
        "reward_mean": [round(r["reward/mean"], 3) for r in trained if r.get("reward/mean") is not None],
        "load1_mean": round(sum(loads) / max(1, len(loads)), 2),
        "load1_max": max(loads, default=0.0),
    }


def trainer_flops(job: dict[str, Any], params: int, gemm_gflops: float) -> dict[str, Any]:
    pairs = [(t, s) for t, s in zip(job["forward_tokens"], job["train_s"], strict=True) if s > 0 and t]
    if not pairs:
        return {}
    rate = sum(6 * params * t for t, _ in pairs) / sum(s for _, s in pairs) / 1e9
    return {"trainer_gflops": round(rate, 1), "share_of_gemm": round(rate / gemm_gflops, 3)}


def measure(code: Path, args: argparse.Namespace, parts: set[str], machine: dict[str, Any]) -> dict[str, Any]:
    """The job (and decode) for the source tree ``code``, each in a subprocess importing it."""
    out: dict[str, Any] = {"code": str(code), "commit": git(code, "rev-parse", "HEAD")}
    if "job" in parts:
        work = Path(tempfile.mkdtemp(prefix="cpu-budget-"))
        try:
            out["job"] = run_job(code, args.steps, args.dtype, work, args.set)
        finally:
            if args.keep:
                log(f"kept the job's run folder and log in {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        out["job"].update(trainer_flops(out["job"], 134_515_008, machine["gemm"]["float32_gflops"]))
    if "decode" in parts:
        env = {**os.environ, "PYTHONPATH": str(code / "src")}
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--decode-child",
                str(machine["bandwidth"]["copy_gb_s"]),
                "--decode-prompt",
                str(args.decode_prompt),
                "--decode-gemm",
                str(machine["gemm"]["float32_gflops"]),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        out["decode"] = json.loads(child.stdout)
    return out


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--before", help="also measure this commit (a worktree in /tmp/cpu-before), first")
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument(
        "--after", help="with --before: measure this commit (a worktree in /tmp/cpu-after), not --code"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--only", default="gemm,decode,job")
    parser.add_argument("--set", action="append", default=[], help="more --set overrides for the job")
    parser.add_argument("--decode-prompt", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results JSON goes")
    parser.add_argument("--keep", action="store_true", help="keep the job's run folder (its path is logged)")
    parser.add_argument("--decode-child", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--decode-gemm", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decode_child is not None:
        print(json.dumps(measure_decode(args.decode_prompt, args.decode_child, args.decode_gemm)))
        return
    parts = set(args.only.split(","))
    machine = {"cpu": cpu_description(), "gemm": measure_gemm(), "bandwidth": measure_bandwidth()}
    log(f"machine: {json.dumps(machine)}")
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "dtype": args.dtype,
        "machine": machine,
        "note": "load1 is the 1-minute load average when each number was taken; the machine was shared",
    }
    if args.before:
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(BEFORE_DIR), args.before], cwd=ROOT, check=True
        )
        try:
            result["before"] = measure(BEFORE_DIR, args, parts, machine)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(BEFORE_DIR)], cwd=ROOT, check=False)
        if args.after:  # a commit, not the checkout (which may hold others' uncommitted work)
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(AFTER_DIR), args.after], cwd=ROOT, check=True
            )
            try:
                result["after"] = measure(AFTER_DIR, args, parts, machine)
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(AFTER_DIR)], cwd=ROOT, check=False
                )
        else:
            result["after"] = measure(args.code, args, parts, machine)
    else:
        result["current"] = measure(args.code, args, parts, machine)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
