"""The embedded engine vs vLLM-CPU, side by side, both driven through harnessrl's Engine interface.

Same model folder, prompts and sampling on both sides: :class:`~harnessrl.engines.embedded.EmbeddedEngine`
in this process, and a real vLLM server (``.venv-vllm``, from ``./install.sh --bench``; started by
:class:`~harnessrl.engines.launch.EngineServer`, compiled as a user would serve it unless
``--enforce-eager``) through ``create_engine(EngineConfig(model="vllm:URL", tokenizer=FOLDER))`` —
the pool and ``VLLMEngine`` the gateway uses. Both get the same number of torch threads
(``--threads``, default 2: ``torch.set_num_threads`` here, ``OMP_NUM_THREADS`` for vLLM).

Workloads (every combination): 8 and 32 concurrent generations; ``shared`` prompts (one
``--prefix-tokens`` prefix + ``--suffix-tokens`` distinct tokens each, like an RL group) and
``distinct`` prompts of the same length; ``GenerationContext(stream=True)`` and ``stream=False``
(vLLM then answers in one JSON response; the embedded engine ignores the flag). Sampling: T = 1.0,
top_p = 1, ``max_tokens = --new-tokens``, no stop token IDs. Prompts are random non-special token
IDs, fresh for every round and workload (the same for both engines), so vLLM's prefix cache only
ever helps within one workload's requests, as the embedded engine's prefix sharing does.

Both engines are loaded together but never generate at the same time: each workload is measured on
one engine, then on the other, the order swapping every round, so background load on a shared
machine hits both alike. Per engine and workload: generated tokens / wall time, the mean and p50
time to first token (submission of the whole batch to the first ``TokenSample`` ``generate`` yields),
mean latency, CPU cores used (CPU seconds per wall second of this process and of vLLM's process
group: a vLLM run near 1.0 instead of 2.0 is one whose OpenMP threads fought for the cores), and the
ratio vLLM/embedded; the best round by wall time is reported, every round's time is kept. TTFT is
compared only when streamed: with ``stream=False`` vLLM's first token arrives with its last. Also
vLLM's start-up time (process start to serving; its engine init, which includes compiling, and
whether it compiled or hit its compile cache) and the torch threads each vLLM process reported
(``leaving Torch threads at N`` in its log).

``VLLMEngine`` sends ``ignore_eos`` (only the caller's stop tokens end an answer), so both engines
generate exactly ``max_tokens``; tokens/s counts the tokens actually generated anyway and
``short_answers`` says how many ended early (0 expected).

Sizes per model (flags override): ``tiny`` 128 new tokens, prompts 512 + 16, 3 rounds (~5 min on 2
CPU cores, vLLM start-up ~70 s of it); ``smollm2`` 16 new tokens, prompts 128 + 16, 1 round
(SmolLM2 fp32 prefills ~150-250 tokens/s and decodes 20-60 tokens/s here; ~6-7 min estimated, ~3 of
them vLLM's start-up). vLLM compiles at every start: loading its compile cache fails with vLLM-CPU
0.32 here (``compile_cache_load_failure``).

Run::

    .venv/bin/python benchmarks/engines_vs_vllm.py                    # tiny
    .venv/bin/python benchmarks/engines_vs_vllm.py --model smollm2    # SmolLM2-135M-Instruct fp32
    .venv/bin/python benchmarks/engines_vs_vllm.py --quick            # smoke test, ~1.5 min
    .venv/bin/python benchmarks/engines_vs_vllm.py --enforce-eager    # vLLM without compilation

Writes ``benchmarks/results/engines_vs_vllm.json`` (one entry per model and vLLM mode; other entries
are kept). ``--quick`` writes ``/tmp/engines_vs_vllm.quick.json`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "engines_vs_vllm.json"
QUICK_RESULTS = Path(tempfile.gettempdir()) / "engines_vs_vllm.quick.json"
ENGINES = ("embedded", "vllm")
# Sized so a full run takes ~6 minutes on 2 CPU cores: SmolLM2 fp32 prefills ~150-250 tokens/s and
# decodes 20-60 tokens/s here, so its prompts and answers are shorter and it gets one round.
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"new_tokens": 128, "prefix_tokens": 512, "suffix_tokens": 16, "batches": "8,32", "rounds": 3},
    "smollm2": {"new_tokens": 16, "prefix_tokens": 128, "suffix_tokens": 16, "batches": "8,32", "rounds": 1},
}
QUICK = {"new_tokens": 8, "prefix_tokens": 64, "suffix_tokens": 8, "batches": "4,8", "rounds": 1}
COMPILATION_MODES = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}


@dataclass(frozen=True)
class Workload:
    batch: int
    prompts: str  # "shared" | "distinct"
    stream: bool

    @property
    def name(self) -> str:
        return f"b{self.batch} {self.prompts} {'stream' if self.stream else 'whole'}"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny | smollm2 | a Hugging Face model folder")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of each engine")
    ap.add_argument("--new-tokens", type=int, default=None, help="max_tokens (default: per model, below)")
    ap.add_argument("--prefix-tokens", type=int, default=None, help="prompt length before the suffix")
    ap.add_argument("--suffix-tokens", type=int, default=None)
    ap.add_argument("--batches", default=None, help="concurrent generations, comma-separated (8,32)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="measured rounds (the best by wall time is reported)"
    )
    ap.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM's CPU KV cache")
    ap.add_argument(
        "--quick", action="store_true", help="smoke test: 8 tokens, short prompts, batches 4,8, 1 round"
    )
    ap.add_argument("--ready-timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    defaults = QUICK if args.quick else MODEL_DEFAULTS.get(args.model, MODEL_DEFAULTS["smollm2"])
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.batch_sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    args.out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
    return args


# --- prompts -----------------------------------------------------------------------------------------


def make_prompts(
    workload: Workload, ids: list[int], prefix_tokens: int, suffix_tokens: int, rng: random.Random
) -> list[list[int]]:
    """``batch`` prompts of ``prefix_tokens + suffix_tokens`` random IDs: one shared prefix, or none."""
    shared = rng.choices(ids, k=prefix_tokens)
    return [
        (shared if workload.prompts == "shared" else rng.choices(ids, k=prefix_tokens))
        + rng.choices(ids, k=suffix_tokens)
        for _ in range(workload.batch)
    ]


# --- measuring ---------------------------------------------------------------------------------------


async def _one(
    engine: Any, prompt: list[int], params: Any, context: Any, t0: float
) -> tuple[int, float, float]:
    """(tokens, time to first token, latency) of one generation, times from the batch's start ``t0``."""
    tokens, first = 0, None
    async for batch in engine.generate(prompt, params, context):
        tokens += len(batch.token_ids)
        if first is None:
            first = time.perf_counter() - t0
    return tokens, (first if first is not None else float("nan")), time.perf_counter() - t0


def group_cpu_seconds(pgid: int | None) -> float:
    """CPU seconds (user + system) used so far by the live processes of process group ``pgid``."""
    if pgid is None:
        return 0.0
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if int(fields[2]) == pgid:  # fields[0] is the state; pgrp is field 5 of stat
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


async def measure(
    engine: Any, prompts: list[list[int]], new_tokens: int, stream: bool, server_pgid: int | None = None
) -> dict[str, Any]:
    """One batch of concurrent generations. ``cores_used``: CPU seconds per wall second of this
    process (the embedded engine, or vLLM's client) and of the vLLM server's processes."""
    from harnessrl.engines.base import GenerationContext, SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=())
    context = GenerationContext(stream=stream)
    load = os.getloadavg()[0]
    cpu0, server_cpu0 = time.process_time(), group_cpu_seconds(server_pgid)
    t0 = time.perf_counter()
    results = await asyncio.gather(*[_one(engine, p, params, context, t0) for p in prompts])
    seconds = time.perf_counter() - t0
    cpu, server_cpu = time.process_time() - cpu0, group_cpu_seconds(server_pgid) - server_cpu0
    tokens = [r[0] for r in results]
    ttft = [r[1] for r in results]
    return {
        "tokens": sum(tokens),
        "expected_tokens": new_tokens * len(prompts),
        "short_answers": sum(t < new_tokens for t in tokens),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(sum(tokens) / seconds, 2),
        "ttft_mean_s": round(statistics.fmean(ttft), 3),
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "latency_mean_s": round(statistics.fmean(r[2] for r in results), 3),
        "cores_used": {
            "this_process": round(cpu / seconds, 2),
            **({"vllm_server": round(server_cpu / seconds, 2)} if server_pgid is not None else {}),
        },
        "load_average_1m": round(load, 2),
    }


async def warm_up(engine: Any, ids: list[int], args: argparse.Namespace, rng: random.Random) -> None:
    """First requests of each shape (a full-length prompt, the largest batch, both modes)."""
    length = args.prefix_tokens + args.suffix_tokens
    await measure(engine, [rng.choices(ids, k=length)], 4, True)
    for stream in (True, False):
        await measure(engine, [rng.choices(ids, k=32) for _ in range(max(args.batch_sizes))], 4, stream)


# --- machine and vLLM facts --------------------------------------------------------------------------


def cpu_facts() -> dict[str, Any]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "isa": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def vllm_versions(python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, platform\n"
        "def v(*names):\n"
        "    for n in names:\n"
        "        try: return m.version(n)\n"
        "        except m.PackageNotFoundError: pass\n"
        "print(v('vllm-cpu', 'vllm'), v('torch'), platform.python_version())"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {"vllm": out[0], "vllm_torch": out[1], "vllm_python": out[2]}


def vllm_log_facts(log: str) -> dict[str, Any]:
    """What vLLM's log says about threads: each process's torch threads (the Worker runs the model;
    vLLM logs ``leaving Torch threads at N`` when OMP_NUM_THREADS is set) and its OpenMP binding."""
    threads: dict[str, int] = {}
    for m in re.finditer(
        r"\((\w+) pid=\d+\).*?(?:leaving Torch threads at|Reducing Torch threads from \d+ to) (\d+)", log
    ):
        threads[m.group(1)] = int(m.group(2))
    binding = [
        ln.split("] ", 1)[-1].strip()
        for ln in log.splitlines()
        if re.search(r"OMP_THREADS_BIND|reserve_cpu_num|reserved_cpus", ln)
    ]
    load_failure = re.search(r"Compiling model again due to a load failure from \S+, reason: (.*)", log)
    init = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", log)
    return {
        "torch_threads_by_process": threads,
        "omp_binding_log": binding,
        # the engine's own start-up (profiling, KV cache, compilation) within startup_s
        "engine_init_s": float(init.group(1)) if init else None,
        # vLLM logs the save only when it compiled (a compile-cache hit loads silently)
        "compiled_at_startup": "saved AOT compiled function" in log,
        # vLLM-CPU 0.32 here: "'function' object has no attribute 'finalize_loading'", every start
        "compile_cache_load_failure": load_failure.group(1).strip() if load_failure else None,
    }


def vllm_server_facts(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(f"{url}/server_info?config_format=json", timeout=30) as response:  # noqa: S310
        info = json.loads(response.read())
    config = info.get("vllm_config") or {}
    scheduler = config.get("scheduler_config") or {}
    cache = config.get("cache_config") or {}
    compilation = config.get("compilation_config") or {}
    return {
        "max_num_seqs": scheduler.get("max_num_seqs"),
        "max_num_batched_tokens": scheduler.get("max_num_batched_tokens"),
        "enable_chunked_prefill": scheduler.get("enable_chunked_prefill"),
        "enable_prefix_caching": cache.get("enable_prefix_caching"),
        "compilation_mode": COMPILATION_MODES.get(compilation.get("mode"), compilation.get("mode")),
        "compilation_backend": compilation.get("backend"),
        "enforce_eager": (config.get("model_config") or {}).get("enforce_eager"),
    }


# --- results -----------------------------------------------------------------------------------------


def summarize(
    rounds: dict[tuple[str, str], list[dict[str, Any]]], workloads: list[Workload]
) -> list[dict[str, Any]]:
    """Per workload: each engine's best round (shortest wall time) and the vLLM/embedded ratios."""
    rows = []
    for w in workloads:
        row: dict[str, Any] = {"workload": w.name, "batch": w.batch, "prompts": w.prompts, "stream": w.stream}
        for engine in ENGINES:
            measured = rounds.get((w.name, engine))
            if measured:
                row[engine] = {
                    **min(measured, key=lambda r: r["seconds"]),
                    "rounds_seconds": [r["seconds"] for r in measured],
                }
        if "embedded" in row and "vllm" in row:
            e, v = row["embedded"], row["vllm"]
            row["vllm_over_embedded"] = {"tokens_per_s": round(v["tokens_per_s"] / e["tokens_per_s"], 2)}
            if w.stream:  # not streamed, vLLM's first token comes with its last: no TTFT to compare
                row["vllm_over_embedded"] |= {
                    "ttft_mean": round(v["ttft_mean_s"] / e["ttft_mean_s"], 2),
                    "ttft_p50": round(v["ttft_p50_s"] / e["ttft_p50_s"], 2),
                }
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], title: str) -> dict[str, float]:
    """The table, and the geometric means of the vLLM/embedded ratios over the workloads (TTFT: over
    the streamed ones; not streamed, vLLM's "first token" is its whole answer)."""
    print(f"\n{title}")
    head = (
        f"{'workload':<20}{'tok/s emb':>10}{'vllm':>8}{'v/e':>7}"
        f"{'TTFT mean/p50 emb':>20}{'vllm':>12}{'v/e':>7}{'cores emb':>11}{'vllm+client':>13}"
    )
    print(head)
    print("-" * len(head))
    ratios: dict[str, list[float]] = {"tokens_per_s": [], "ttft_mean": [], "ttft_p50": []}
    for r in rows:
        e, v, q = r.get("embedded"), r.get("vllm"), r.get("vllm_over_embedded")
        if not (e and v and q):
            continue
        for name in ratios:
            if name in q:
                ratios[name].append(q[name])
        short = f"  ({v['short_answers']} vLLM answers short)" if v["short_answers"] else ""
        cores = v["cores_used"]
        print(
            f"{r['workload']:<20}{e['tokens_per_s']:>10.1f}{v['tokens_per_s']:>8.1f}{q['tokens_per_s']:>6.2f}x"
            f"{e['ttft_mean_s']:>14.2f}/{e['ttft_p50_s']:<5.2f}{v['ttft_mean_s']:>6.2f}/{v['ttft_p50_s']:<5.2f}"
            + (f"{q['ttft_mean']:>6.2f}x" if "ttft_mean" in q else f"{'-':>7}")
            + f"{e['cores_used']['this_process']:>11.2f}"
            f"{cores.get('vllm_server', 0):>8.2f}+{cores['this_process']:.2f}{short}"
        )
    means = {name: round(statistics.geometric_mean(values), 2) for name, values in ratios.items() if values}
    if means:
        print(
            f"{'geometric mean':<20}{'':>18}{means['tokens_per_s']:>6.2f}x{'':>31}{means.get('ttft_mean', float('nan')):>6.2f}x"
        )
    return means


def write(args: argparse.Namespace, entry: dict[str, Any]) -> None:
    """Replace this model's (and vLLM mode's) entry in the JSON, keeping the others."""
    data: dict[str, Any] = {}
    if args.out.exists():
        try:
            data = json.loads(args.out.read_text())
        except json.JSONDecodeError:
            data = {}
    data["benchmark"] = "embedded engine vs vLLM-CPU, both through harnessrl's Engine interface"
    data.setdefault("runs", {})[entry["key"]] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")


# --- main --------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch  # after argument parsing: --help needs no torch

    torch.set_num_threads(args.threads)

    from harnessrl.config import EngineConfig
    from harnessrl.engines.embedded import EmbeddedEngine
    from harnessrl.engines.factory import create_engine
    from harnessrl.engines.launch import EngineServer, VLLMLaunch, find_vllm_python, free_port
    from harnessrl.engines.models import resolve_model_dir

    model_dir = resolve_model_dir(args.model)
    python = find_vllm_python()
    workloads = [
        Workload(batch, prompts, stream)
        for batch in args.batch_sizes
        for prompts in ("shared", "distinct")
        for stream in (True, False)
    ]
    key = f"{args.model}{' eager' if args.enforce_eager else ''}{' quick' if args.quick else ''}"
    log_dir = Path(tempfile.mkdtemp(prefix="engines_vs_vllm."))
    launch = VLLMLaunch(
        model=str(model_dir),
        served_model_name=args.model if args.model in ("tiny", "smollm2") else None,
        port=free_port(),
        kv_cache_gib=args.kv_cache_gib,
        threads=args.threads,
        enforce_eager=args.enforce_eager,
    )
    server = EngineServer(launch, log_dir / "vllm.log", python=python)
    embedded = EmbeddedEngine(
        model_dir, model_name=args.model, max_batch_size=max(args.batch_sizes), num_threads=args.threads
    )
    engines: dict[str, Any] = {}
    started = time.perf_counter()
    entry: dict[str, Any] = {"key": key}
    try:
        print(f"model {args.model} ({model_dir}); vLLM log {server.log_path}", flush=True)
        await embedded.start()
        engines["embedded"] = embedded
        t0 = time.perf_counter()
        server.start()
        await asyncio.to_thread(
            server.wait_ready, args.ready_timeout_s, progress=lambda m: print(f"  {m}", flush=True)
        )
        startup_s = time.perf_counter() - t0
        print(f"vLLM serving after {startup_s:.1f} s", flush=True)
        vllm = create_engine(EngineConfig(model=server.engine_model, tokenizer=str(model_dir)))
        await vllm.start()
        engines["vllm"] = vllm
        ids = sorted(set(range(embedded.tokenizer.vocab_size)) - embedded.tokenizer.special_token_ids)
        for name, engine in engines.items():
            await warm_up(engine, ids, args, random.Random(f"warmup {name}"))
        measured: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_ in range(args.rounds):
            order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
            for w in workloads:
                prompts = make_prompts(
                    w, ids, args.prefix_tokens, args.suffix_tokens, random.Random(f"{round_} {w.name}")
                )
                for name in order:
                    pgid = server.process.pid if name == "vllm" and server.process else None
                    result = await measure(engines[name], prompts, args.new_tokens, w.stream, pgid)
                    measured.setdefault((w.name, name), []).append(result)
                    print(
                        f"  round {round_ + 1}/{args.rounds} {w.name:<20} {name:<9} "
                        f"{result['tokens_per_s']:8.1f} tok/s  TTFT {result['ttft_mean_s']:.2f} s  "
                        f"({result['seconds']:.1f} s, cores {result['cores_used']}, "
                        f"load {result['load_average_1m']})",
                        flush=True,
                    )
        rows = summarize(measured, workloads)
        log_text = server.log_path.read_text(errors="replace")
        import transformers

        entry.update(
            {
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "model": args.model,
                "model_dir": str(model_dir),
                "complete": True,
                "machine": {
                    **cpu_facts(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    **vllm_versions(python),
                },
                "settings": {
                    "threads": args.threads,
                    "embedded_torch_threads": torch.get_num_threads(),
                    "embedded_prefix_sharing": True,
                    "embedded_max_batch_size": max(args.batch_sizes),
                    "dtype": "float32",
                    "new_tokens": args.new_tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "stop_token_ids": [],
                    "prefix_tokens": args.prefix_tokens,
                    "suffix_tokens": args.suffix_tokens,
                    "batches": args.batch_sizes,
                    "rounds": args.rounds,
                    "reported": "best round by wall time",
                    "order": "per workload one engine then the other, swapped every round",
                    "ttft": "from submitting the batch to the first TokenSample generate() yields "
                    "(vLLM stream=False: the whole answer)",
                    "quick": args.quick,
                },
                "vllm": {
                    "startup_s": round(startup_s, 1),
                    "enforce_eager": args.enforce_eager,
                    "kv_cache_gib": args.kv_cache_gib,
                    "omp_num_threads": args.threads,
                    **vllm_log_facts(log_text),
                    **vllm_server_facts(server.url),
                },
                "results": rows,
                "total_s": round(time.perf_counter() - started, 1),
            }
        )
        title = (
            f"{args.model}: {args.new_tokens} new tokens, prompts {args.prefix_tokens}+{args.suffix_tokens}, "
            f"{args.threads} threads, vLLM {'eager' if args.enforce_eager else 'compiled'} "
            f"(start-up {startup_s:.0f} s, torch threads {entry['vllm']['torch_threads_by_process'] or '?'})"
        )
        entry["geometric_mean_vllm_over_embedded"] = print_table(rows, title)
        write(args, entry)
        print(f"\ntotal {entry['total_s']:.0f} s; wrote {args.out}")
    finally:
        for engine in engines.values():
            await engine.aclose()
        server.stop()


def main() -> None:
    asyncio.run(run(parse_args()))


if __name__ == "__main__":
    main()
