"""How much computing a group's shared prompt once saves, on calls a real harness made.

Reads the store of a ``benchmarks/harness_learning.py`` run (mini-swe-agent on the shell_agent
example) and replays the model calls of its first training groups through the embedded engine,
once with prefix sharing and once without, interleaved (on, off, on, off...): the calls of one group
are sent at once, as the group's rollouts sent them, each generating as many tokens as it did then.
Reported side by side: prompt tokens prefilled, tokens reused from a decoding row, and wall seconds.

The trainer side is counted, not timed: the tokens a step's forward pass covers with shared-prefix
rows (``trainer.share_prefixes = true``) against plain packed rows, for the same samples.

    .venv/bin/python benchmarks/harness_prefix_sharing.py --store /tmp/hl/work/run/harnessrl.db
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "harness_prefix_sharing.json"


def load_groups(store_path: Path, groups: int) -> list[list[Any]]:
    """The calls of the first ``groups`` training groups, in rollout order: [[call, ...], ...]."""
    from harnessrl.store.sqlite import SQLiteStore

    store = SQLiteStore(store_path)
    by_group: dict[str, list[Any]] = defaultdict(list)
    for rollout in store.list_rollouts():
        if rollout.group_id and rollout.step is not None:
            by_group[rollout.group_id].append(rollout)
    chosen = sorted(by_group.values(), key=lambda rs: min(r.created_at for r in rs))[:groups]
    out = [[call for r in rollouts for call in store.list_calls(r.rollout_id)] for rollouts in chosen]
    store.close()
    return out


async def replay(model: str, groups: list[list[Any]], prefix_sharing: bool) -> dict[str, float]:
    from harnessrl.config import EngineConfig
    from harnessrl.engines.base import SamplingParams
    from harnessrl.engines.factory import create_engine

    engine = create_engine(EngineConfig(model=model, dtype="bfloat16", prefix_sharing=prefix_sharing))
    await engine.start()
    before = await engine.health()
    started = time.monotonic()
    for calls in groups:
        by_seq: dict[int, list[Any]] = defaultdict(list)
        for call in calls:
            by_seq[call.seq].append(call)
        for seq in sorted(by_seq):  # a group's first calls together, then its second calls...

            async def one(call: Any) -> None:
                params = SamplingParams(max_tokens=max(1, len(call.response_token_ids)), temperature=1.0)
                async for _ in engine.generate(call.prompt_token_ids, params):
                    pass

            await asyncio.gather(*(one(c) for c in by_seq[seq]))
    seconds = time.monotonic() - started
    after = await engine.health()
    await engine.aclose()
    return {
        "seconds": round(seconds, 2),
        "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
        "prefix_reused_tokens": after["prefix_reused_tokens"] - before["prefix_reused_tokens"],
    }


def trainer_tokens(store_path: Path, groups: int) -> dict[str, int]:
    """Tokens the forward pass covers for the first groups' samples: shared-prefix rows vs packed rows."""
    from harnessrl.store.sqlite import SQLiteStore
    from harnessrl.trainer.prefix_tree import prefix_micro_batches
    from harnessrl.trajectory import build_batch
    from harnessrl.trajectory.samples import common_prefix

    store = SQLiteStore(store_path)
    rollouts = [
        r for r in store.list_rollouts() if r.group_id and r.step is not None and r.reward is not None
    ]
    first = sorted(
        {r.group_id for r in rollouts}, key=lambda g: min(r.created_at for r in rollouts if r.group_id == g)
    )
    chosen = [r for r in rollouts if r.group_id in set(first[:groups])]
    batch = build_batch([(r, store.list_calls(r.rollout_id)) for r in chosen])
    store.close()
    plain = sum(len(s) for s in batch.samples)
    shared = 0
    for micro in prefix_micro_batches(batch.samples, 1 << 30, 1 << 30):
        for row in micro:
            previous: list[int] = []
            for sample in row:  # a sample adds its tokens past its common prefix with the one before
                shared += len(sample.input_ids) - common_prefix(sample.input_ids, previous)
                previous = sample.input_ids
    return {"samples": len(batch.samples), "tokens_packed_rows": plain, "tokens_shared_prefix_rows": shared}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--groups", type=int, default=4, help="training groups replayed (one step's worth)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    groups = load_groups(args.store, args.groups)
    calls = sum(len(g) for g in groups)
    runs: dict[str, list[dict[str, float]]] = {"sharing": [], "no_sharing": []}
    for _ in range(args.rounds):
        for name, on in (("sharing", True), ("no_sharing", False)):
            runs[name].append(asyncio.run(replay(args.model, groups, on)))
    mean = {name: {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]} for name, rs in runs.items()}
    result = {
        "groups": len(groups),
        "calls": calls,
        "prompt_tokens": sum(len(c.prompt_token_ids) for g in groups for c in g),
        "engine": runs,
        "engine_prefill_ratio": round(
            mean["sharing"]["prefill_tokens"] / mean["no_sharing"]["prefill_tokens"], 3
        ),
        "engine_seconds_ratio": round(mean["sharing"]["seconds"] / mean["no_sharing"]["seconds"], 3),
        "trainer": trainer_tokens(args.store, args.groups),
    }
    trainer = result["trainer"]
    trainer["ratio"] = round(trainer["tokens_shared_prefix_rows"] / max(1, trainer["tokens_packed_rows"]), 3)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: result[k] for k in ("calls", "engine_prefill_ratio", "engine_seconds_ratio")}
            | {"trainer_ratio": trainer["ratio"]}
        )
    )


if __name__ == "__main__":
    main()
