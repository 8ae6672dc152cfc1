"""Retrieval speed on a 100k-passage corpus: queries/s and latency percentiles, in-process and through
the gateway's search route as a harness reaches it; tantivy (what harnessrl uses) beside bm25s.

The corpus is the generated encyclopedia scaled up (``harnessrl.tasks.search.make_world``: ~100k
passages about fictional entities); the queries are its questions (1-3 hops), one at a time as a
harness's tool asks. Three measurements, side by side in one run:

- ``tantivy``: ``RetrievalIndex.search`` in this process (what the gateway runs per search);
- ``bm25s``: the same queries through bm25s 0.3's own tokenizer and ``retrieve`` (k=3, one thread),
  if it is installed (``pip install bm25s``): the library the issue named as the other candidate;
- ``gateway``: ``POST /rollouts/{id}/search`` on a real gateway (uvicorn, 127.0.0.1), one client and 8
  concurrent clients, each search recorded in the SQLite store as in a run (rate limit lifted).

    .venv/bin/python benchmarks/retrieval_speed.py                 # writes benchmarks/results/retrieval_speed.json
    .venv/bin/python benchmarks/retrieval_speed.py --passages 5000 --queries 200 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.retrieval.index import RetrievalIndex
from harnessrl.tasks.search import corpus_passages, make_questions, make_world

RESULTS = Path(__file__).resolve().parent / "results" / "retrieval_speed.json"


def percentiles(latencies_s: list[float], wall_s: float) -> dict[str, float]:
    ordered = sorted(latencies_s)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
    return {
        "queries": len(ordered),
        "queries_per_s": round(len(ordered) / wall_s, 1),
        "p50_ms": round(pick(0.5), 3),
        "p99_ms": round(pick(0.99), 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def timed(fn: Any, queries: list[str]) -> dict[str, float]:
    for q in queries[:20]:  # warm up
        fn(q)
    latencies = []
    started = time.perf_counter()
    for q in queries:
        t = time.perf_counter()
        fn(q)
        latencies.append(time.perf_counter() - t)
    return percentiles(latencies, time.perf_counter() - started)


def bm25s_numbers(passages: list[dict[str, str]], queries: list[str]) -> dict[str, Any]:
    try:
        import bm25s
    except ImportError:
        return {"skipped": "bm25s is not installed (pip install bm25s)"}
    started = time.perf_counter()
    tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
    texts = [f"{p['title']} {p['text']}" for p in passages]
    retriever = bm25s.BM25()
    retriever.index(tokenizer.tokenize(texts, show_progress=False, return_as="tuple"), show_progress=False)
    build_s = time.perf_counter() - started

    def search(query: str) -> Any:
        ids = tokenizer.tokenize([query], show_progress=False, update_vocab=False, return_as="ids")
        return retriever.retrieve(ids, k=3, show_progress=False, n_threads=1)

    return {"version": bm25s.__version__, "build_s": round(build_s, 2), **timed(search, queries)}


def gateway_numbers(index: RetrievalIndex, corpus: Path, queries: list[str], clients: int) -> dict[str, Any]:
    from harnessrl.client import GatewayClient
    from harnessrl.config import GatewayConfig
    from harnessrl.engines.scripted import ScriptedEngine
    from harnessrl.engines.tiny import tiny_model_dir
    from harnessrl.gateway import create_app
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.retrieval.route import RetrievalRoutes
    from harnessrl.store.sqlite import SQLiteStore
    from harnessrl.tokenizer import PolicyTokenizer

    folder = Path(tempfile.mkdtemp(prefix="retrieval-speed-"))
    store = SQLiteStore(folder / "store.db")
    config = RetrievalConfig(corpus=str(corpus), rate_per_s=1e9, burst=10**9)
    engine = ScriptedEngine(["unused"], PolicyTokenizer.from_dir(tiny_model_dir(weights=False)))
    app = create_app(
        GatewayConfig(admin_key="bench"),
        store,
        engine,
        extra_routes=RetrievalRoutes(index, config).factories(),
    )
    with serve_in_thread(app) as url, GatewayClient(url, "bench") as admin:
        rollout = admin.create_rollout({"prompt": "bench"})
        target, headers = (
            f"{url}/rollouts/{rollout['rollout_id']}/search",
            {"authorization": f"Bearer {rollout['api_key']}"},
        )
        with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=clients)) as client:

            def search(query: str) -> float:
                t = time.perf_counter()
                answer = client.post(target, json={"query": query, "top_k": 3}, headers=headers)
                answer.raise_for_status()
                return time.perf_counter() - t

            for q in queries[:20]:
                search(q)
            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                latencies = list(pool.map(search, queries))
            result = percentiles(latencies, time.perf_counter() - started)
        result["recorded"] = len(store.list_tool_requests(rollout["rollout_id"]))
    store.close()
    return {"clients": clients, **result}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000, help="about this many passages")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    scale = args.passages / 3360  # the example's world has 3,360 passages
    world = make_world(
        0,
        countries=round(60 * scale),
        cities=round(500 * scale),
        people=round(1200 * scale),
        orgs=round(400 * scale),
    )
    passages = corpus_passages(world)
    questions = make_questions(world, "train", args.queries, seed=1)
    queries = [q["prompt"] for q in questions]
    work = Path(tempfile.mkdtemp(prefix="retrieval-speed-"))
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in passages))

    started = time.perf_counter()
    index = RetrievalIndex.for_corpus(corpus, work / "cache")
    build_s = time.perf_counter() - started
    started = time.perf_counter()
    RetrievalIndex.for_corpus(corpus, work / "cache")  # the cached index: opened, not rebuilt
    reopen_s = time.perf_counter() - started
    tantivy = {
        "build_s": round(build_s, 2),
        "reopen_s": round(reopen_s, 3),
        **timed(lambda q: index.search(q, 3), queries),
    }
    result = {
        "passages": len(passages),
        "corpus_mb": round(corpus.stat().st_size / 1e6, 1),
        "tantivy": tantivy,
        "bm25s": bm25s_numbers(passages, queries[: max(100, len(queries) // 10)]),
        "gateway_1_client": gateway_numbers(index, corpus, queries[: len(queries) // 2], 1),
        "gateway_8_clients": gateway_numbers(index, corpus, queries[: len(queries) // 2], 8),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_at_end": os.getloadavg(),
        },  # fmt: skip
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command": "python benchmarks/retrieval_speed.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps({k: result[k] for k in ("passages", "tantivy", "gateway_1_client", "gateway_8_clients")})
    )
    print(json.dumps({"bm25s": result["bm25s"]}))


if __name__ == "__main__":
    main()
