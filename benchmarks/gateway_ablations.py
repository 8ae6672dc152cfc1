"""What each stage of a model call costs the gateway, measured in place: the gateway as ``harnessrl
gateway`` serves it beside copies of it with one stage taken out, in the same rounds.

A stage's cost in a hot loop is a fraction of what it costs inside a call, where the client and the
upstream run between the gateway's turns and its caches are cold (encoding a 1.1 k-character prompt
tail: ~60 us in a loop, ~300 us in a call), and a profiler's samples share the gateway's core with
it. So each stage is measured the way a change to it would be: the chat leg of
``gateway_overhead.py`` at C = 1 (20-turn tool-calling conversations, the shared fake vLLM, each
gateway served as ``run_gateway`` serves it), sent to the full gateway and to one gateway per
ablation, the order turning each round; a stage's cost is the full gateway's CPU per call minus the
ablated one's.

Ablations (``ABLATIONS``; each still answers every call with status 200, so the conversations go on):

- ``record``: the durable write. ``CallWriter.add_now`` gives the call its ``seq`` in memory; nothing is
  written (the prompt reuse of the next call still finds it).
- ``tail_encode``: tokenizing prompt text. ``PolicyTokenizer.encode`` of a text of 200 characters or
  more returns one stand-in ID per 4 characters (the short texts around the splice stay real).
- ``template_render``: the chat template. ``render_chat`` joins ChatML turns (``<|im_start|>role``,
  the content, the tokenizer's first stop token) with no tools header and no tool-call markup.
- ``engine_call``: the exchange with the engine (``EnginePool.generate``: the HTTP request with the
  token-ID prompt, reading and parsing vLLM's answer). The first call asks the engine; every later one
  gets that call's samples again. This also takes out the wait in the middle of the call (the
  gateway sleeps while the upstream works and wakes with cold caches), so it bounds from above what
  a cheaper exchange could save.
- ``answer_logprobs``: the ``logprobs`` the client asked for (the benchmark's bodies ask, as Agent
  Lightning's train mode does upstream): the answer leaves them out.
- ``pipeline``: everything after the HTTP server and the ASGI layers hand the call over: the chat
  route reads the body and answers a fixed completion (what the transport costs a call).

The stand-ins make prompts, answers and records wrong: these are numbers for deciding where to work,
never a gateway to run.

    .venv/bin/python benchmarks/gateway_ablations.py --rounds 100 --out benchmarks/results/gateway_ablations.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_overhead as go  # noqa: E402
import measure  # noqa: E402

HERE = Path(__file__).resolve()
RESULTS = HERE.parent / "results" / "gateway_ablations.json"
#: Texts shorter than this keep their real encoding under ``tail_encode`` (the glue around a splice).
STAND_IN_FROM_CHARS = 200
FIXED_ANSWER = json.dumps(
    {
        "id": "chatcmpl-fixed",
        "object": "chat.completion",
        "model": go.MODEL,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "fixed"}, "finish_reason": "stop"}
        ],
    }
).encode()


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` while the block runs (a dict's item where ``owner`` is a dict)."""
    if isinstance(owner, dict):
        old = owner[name]
        owner[name] = value
        try:
            yield
        finally:
            owner[name] = old
        return
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _without_record() -> contextlib.AbstractContextManager[None]:
    from harnessrl.gateway.writer import CallWriter

    seqs: dict[str, int] = {}

    def add_now(self: CallWriter, call: Any, encoded: Any = None) -> Any:
        seq = seqs.get(call.rollout_id, 0)
        seqs[call.rollout_id] = seq + 1
        return call.model_copy(update={"seq": seq})

    return _replaced(CallWriter, "add_now", add_now)


def _without_tail_encode() -> contextlib.AbstractContextManager[None]:
    from harnessrl.tokenizer import PolicyTokenizer

    real = PolicyTokenizer.encode

    def encode(self: PolicyTokenizer, text: str) -> list[int]:
        if len(text) >= STAND_IN_FROM_CHARS:
            return [7] * (len(text) // 4)
        return real(self, text)

    return _replaced(PolicyTokenizer, "encode", encode)


def _without_template_render() -> contextlib.AbstractContextManager[None]:
    from harnessrl.tokenizer import PolicyTokenizer

    def render_chat(
        self: PolicyTokenizer,
        messages: list[dict[str, Any]],
        tools: Any = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        end = self.decode([self.stop_token_ids[0]])
        turns = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}{end}\n" for m in messages]
        return "".join(turns) + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    return _replaced(PolicyTokenizer, "render_chat", render_chat)


def _without_engine_call() -> contextlib.AbstractContextManager[None]:
    from harnessrl.engines.base import Samples
    from harnessrl.engines.pool import EnginePool

    real = EnginePool.generate
    first: list[Samples] = []

    async def generate(self: EnginePool, prompt_ids: Any, params: Any, context: Any = None) -> Any:
        if not first:
            async for batch in real(self, prompt_ids, params, context):
                first.append(batch)
        for batch in first:
            yield Samples(list(batch.token_ids), list(batch.logprobs))

    return _replaced(EnginePool, "generate", generate)


def _without_answer_logprobs() -> contextlib.AbstractContextManager[None]:
    from harnessrl.gateway.apis.chat import ChatAnswer

    real = ChatAnswer.__init__

    def init(self: ChatAnswer, call: Any, body: Any) -> None:
        real(self, call, body.model_copy(update={"logprobs": False}))

    return _replaced(ChatAnswer, "__init__", init)


def _without_pipeline() -> contextlib.AbstractContextManager[None]:
    from starlette.requests import Request
    from starlette.responses import Response

    from harnessrl.gateway import app

    async def fixed(request: Request) -> Response:
        await request.body()
        return Response(FIXED_ANSWER, media_type="application/json")

    return _replaced(app.MODEL_POSTS, "/chat/completions", fixed)  # read by create_app


#: Ablation -> what it takes out (a context manager; ``pipeline`` must be entered before ``create_app``).
ABLATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "record": _without_record,
    "tail_encode": _without_tail_encode,
    "template_render": _without_template_render,
    "engine_call": _without_engine_call,
    "answer_logprobs": _without_answer_logprobs,
    "pipeline": _without_pipeline,
}


def serve_ablated(name: str, port: int, upstream: str, store: str, admin_key: str) -> None:
    """``gateway_overhead.serve_harnessrl`` with ablation ``name`` in place for as long as it serves."""
    with ABLATIONS[name]():
        go.serve_harnessrl(port, upstream, store, admin_key)


def start_gateway(
    procs: list[subprocess.Popen[bytes]], ablation: str | None, upstream: str, tmp: Path, key: str
) -> str:
    port = measure.free_port()
    if ablation is None:
        cmd = [sys.executable, str(HERE.parent / "gateway_overhead.py"), "--role", "harnessrl"]
    else:
        cmd = [sys.executable, str(HERE), "--role", "gateway", "--ablation", ablation]
    store = tmp / f"{ablation or 'full'}.db"
    cmd += ["--port", str(port), "--upstream", upstream, "--store", str(store), "--admin-key", key]
    procs.append(subprocess.Popen(cmd))
    url = f"http://127.0.0.1:{port}"
    measure.wait_http(f"{url}/api/health", procs[-1])
    return url


async def compare(
    urls: dict[str, str], pids: dict[str, int], key: str, rounds: int, conversations: int
) -> dict[str, Any]:
    import aiohttp

    bodies = go.leg_bodies(go.build_reply(go._tokenizer()), 8)["chat"]
    sides = list(urls)
    batches: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=2), timeout=aiohttp.ClientTimeout(total=600)
    ) as session:
        targets = {}
        for side in sides:
            target = go.Harnessrl(urls[side], key)
            target.name, target.pids = side, {"gateway": pids[side]}
            targets[side] = target
            await go.run_batch(session, target, bodies, 1, 1)  # warm-up
        start = {side: measure.user_system_seconds(pids[side]) for side in sides}
        for r in range(rounds):
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                batches[side].append(await go.run_batch(session, targets[side], bodies, conversations, 1))
            print(f"round {r + 1}/{rounds}", flush=True)
    out = {}
    for side, side_batches in batches.items():
        out[side] = go.summarize(side_batches)
        # How much of it was the kernel's (socket writes and reads, SQLite's file writes): /proc's clock ticks.
        calls = out[side]["requests"]
        (user0, system0), (user1, system1) = start[side], measure.user_system_seconds(pids[side])
        out[side]["user_system_ms_per_call"] = {
            "user": round((user1 - user0) / calls * 1000, 3),
            "system": round((system1 - system0) / calls * 1000, 3),
        }
    return out


def report(summaries: dict[str, Any]) -> dict[str, Any]:
    """Each ablation's gateway CPU per call, and what the stage it takes out costs (ms, share of full)."""
    full = summaries["full"]["cpu_ms_per_call"]["gateway"]
    stages = {}
    for name in ABLATIONS:
        if name not in summaries:
            continue
        without = summaries[name]["cpu_ms_per_call"]["gateway"]
        stages[name] = {
            "gateway_cpu_ms": without,
            "system_ms_saved": round(
                summaries["full"]["user_system_ms_per_call"]["system"]
                - summaries[name]["user_system_ms_per_call"]["system"],
                3,
            ),
            "stage_ms": round(full - without, 3),
            "stage_share": round((full - without) / full, 3),
            "errors": summaries[name]["errors"],
        }
    return {
        "full_gateway_cpu_ms": full,
        "full_user_system_ms": summaries["full"]["user_system_ms_per_call"],
        "full_errors": summaries["full"]["errors"],
        "stages": stages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--conversations", type=int, default=2, help="20-turn conversations per batch")
    ap.add_argument(
        "--ablations", default=",".join(ABLATIONS), help=f"comma-separated, of {', '.join(ABLATIONS)}"
    )
    ap.add_argument("--out", type=Path, default=None, help=f"write the JSON here (e.g. {RESULTS})")
    ap.add_argument("--role", choices=["gateway"], help=argparse.SUPPRESS)
    ap.add_argument("--ablation", choices=list(ABLATIONS), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--upstream", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--admin-key", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "gateway":
        serve_ablated(args.ablation, args.port, args.upstream, args.store, args.admin_key)
        return
    chosen = [a.strip() for a in args.ablations.split(",") if a.strip()]
    unknown = sorted(set(chosen) - set(ABLATIONS))
    if unknown or not chosen:
        ap.error(
            f"--ablations: unknown {', '.join(unknown) or '(none given)'}; choose of {', '.join(ABLATIONS)}"
        )
    os.environ.update(go.OFFLINE_ENV)
    key = f"bench-{secrets.token_hex(8)}"
    with tempfile.TemporaryDirectory(prefix="gateway-ablations-") as tmp, measure.processes() as procs:
        up_port = measure.free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        up_cmd = [sys.executable, str(HERE.parent / "gateway_overhead.py"), "--role", "upstream"]
        procs.append(subprocess.Popen([*up_cmd, "--port", str(up_port)]))
        measure.wait_http(f"{upstream}/health", procs[-1])
        urls, pids = {}, {}
        for ablation in [None, *chosen]:
            side = ablation or "full"
            urls[side] = start_gateway(procs, ablation, upstream, Path(tmp), key)
            pids[side] = procs[-1].pid
        summaries = asyncio.run(compare(urls, pids, key, args.rounds, args.conversations))
    result = {
        "benchmark": "gateway_ablations",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "leg": "gateway_overhead's chat leg at C=1 (20-turn tool-calling conversations, 256-token answers)",
        "rounds": args.rounds,
        "conversations_per_batch": args.conversations,
        "load_avg_1m": measure.load_average(),
        **report(summaries),
        "sides": summaries,
    }
    for name, stage in result["stages"].items():
        print(
            f"{name:16s} {stage['stage_ms']:6.3f} ms ({100 * stage['stage_share']:4.1f} %) of "
            f"{result['full_gateway_cpu_ms']:.3f} ms gateway CPU per call "
            f"({stage['system_ms_saved']:.3f} ms of it system time)"
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
