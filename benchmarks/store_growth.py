"""Store growth: what one agent rollout leaves in the store, through the real gateway (issue 22).

What is measured. A SWE-style trace of 50 chat calls goes through the harnessrl gateway
(``create_app`` served by uvicorn on 127.0.0.1, durable SQLite store, the scripted engine with the
``tiny`` model's tokenizer, so prompts are rendered and tokenized exactly as in a run, with
sampled-token reuse). The context starts at a ~10k-token system prompt and grows by each answer
(~100 tokens: some text and a bash tool call) and each tool result (~300 tokens of file listings
and test output), to ~30k tokens at the last call (about 20k on average, the issue's shape).

Then, for that rollout:

- ``stored``: the bytes its ``calls`` rows hold (every column's length: token IDs, JSON text, ids),
  and the database file's growth (pages in use after a WAL checkpoint, minus before the calls);
- ``before``: the same calls written the way schema versions 1-3 stored them (every call's whole
  prompt and whole request) into a version-3 database, measured the same way;
- ``yardstick``: the issue's measure, the final call's prompt + response token IDs (int32) plus its
  request's JSON. The goal: ``stored`` <= 1.5x the yardstick (version 3 stored ~n/2 times it).

An aside, same calls, same machine: the store's write cost per call (``add_call`` into a fresh
store vs the version-3 encoding and insert) and its read cost for the rollout (``list_calls`` vs
version 3's row decoder on its rows), the best of 3 interleaved rounds. Wall time on a shared
2-core machine: read the ratios, not the numbers.

Run::

    .venv/bin/python benchmarks/store_growth.py            # ~20 s on 2 shared cores

Writes ``benchmarks/results/store_growth.json``. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import random
import sqlite3
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import httpx
from measure import column_bytes, load_average

from harnessrl.client import GatewayClient
from harnessrl.config import GatewayConfig
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway import create_app
from harnessrl.gateway.server import serve_in_thread
from harnessrl.schemas import Call, Usage
from harnessrl.store.codecs import dump_json, pack_floats, pack_ints, rollout_to_row
from harnessrl.store.migrations import migrate_sqlite
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

RESULTS = Path(__file__).parent / "results" / "store_growth.json"
CALLS = 50
ADMIN_KEY = "bench-admin"
GOAL = 1.5
REPEATS = 3

_SYSTEM = (
    "You are a software engineering agent working in a sandboxed Linux container. You solve the task by "
    "running shell commands with the bash tool. Think before each step, keep changes minimal, run the "
    "relevant tests after each change, and finish with a short summary of what you changed and why. "
)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository and return stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


# -- the trace --------------------------------------------------------------------------------------


def system_prompt(tokenizer: PolicyTokenizer, tokens: int) -> str:
    """Instructions plus repository notes, about ``tokens`` long (a SWE agent's opening context)."""
    rng = random.Random(1)
    parts = [_SYSTEM]
    while len(tokenizer.encode("".join(parts))) < tokens:
        for _ in range(20):
            parts.append(
                f"- src/pkg/module_{rng.randrange(1000)}.py defines handler_{rng.randrange(100)}(request, "
                f"timeout={rng.randrange(60)}) and is covered by tests/test_module_{rng.randrange(1000)}.py.\n"
            )
    return "".join(parts)


def tool_output(rng: random.Random) -> str:
    """~300 tokens of what a shell answers: a listing, a grep, a failing test."""
    lines = [
        f"src/pkg/module_{rng.randrange(1000)}.py:{rng.randrange(900)}: def handler_{rng.randrange(99)}"
        f"(request, timeout={rng.randrange(60)}):"
        for _ in range(10)
    ]
    lines.append(
        f"FAILED tests/test_parser.py::test_case_{rng.randrange(50)} - AssertionError: {rng.random()}"
    )
    return "\n".join(lines)


def scripted_turns(count: int) -> list[dict[str, Any]]:
    """The engine's answers: some reasoning text and one bash tool call each (~100 tokens)."""
    rng = random.Random(2)
    return [
        {
            "content": (
                f"Step {i}: the failure in test_case_{rng.randrange(50)} points at module_{rng.randrange(1000)}; "
                "the parser keeps a leading space after the colon, so the comparison fails. I will look "
                "at how the continuation lines are handled, then run the narrower test again."
            ),
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {"command": f"grep -rn handler_{rng.randrange(99)} src | head -40"},
                }
            ],
        }
        for i in range(count)
    ]


def run_trace(tmp: Path) -> tuple[SQLiteStore, str, dict[str, Any]]:
    """50 chat calls through the gateway; returns its store, the rollout id and timings."""
    tokenizer = PolicyTokenizer.from_dir(tiny_model_dir(weights=False))
    system = system_prompt(tokenizer, 10_000)
    store = SQLiteStore(tmp / "gateway.db")
    engine = ScriptedEngine(scripted_turns(CALLS), tokenizer, context_length=131_072)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), store, engine)
    rng = random.Random(3)
    latencies: list[float] = []
    with serve_in_thread(app) as url, GatewayClient(url, ADMIN_KEY) as admin:
        rollout = admin.create_rollout({"prompt": "fix the parser"})
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": "The header parser test fails; fix it."},
        ]
        headers = {"Authorization": f"Bearer {rollout['api_key']}"}
        with httpx.Client(base_url=rollout["base_url"], headers=headers, timeout=120) as http:
            for _ in range(CALLS):
                body = {"model": "policy", "messages": messages, "tools": _TOOLS, "max_tokens": 512}
                started = time.perf_counter()
                response = http.post("/chat/completions", json=body)
                latencies.append(time.perf_counter() - started)
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                answer = {
                    k: message[k] for k in ("role", "content", "tool_calls") if message.get(k) is not None
                }
                tool_call_id = message["tool_calls"][0]["id"]
                messages = [
                    *messages,
                    answer,
                    {"role": "tool", "tool_call_id": tool_call_id, "content": tool_output(rng)},
                ]
    latencies.sort()
    timing = {"call_p50_ms": round(1000 * latencies[len(latencies) // 2], 1), "calls": len(latencies)}
    return store, rollout["rollout_id"], timing


# -- measuring ----------------------------------------------------------------------------------


def whole_call_row(call: Call) -> dict[str, Any]:
    """A call's row as schema versions 1-3 stored it: the whole prompt and the whole request."""
    row = call.model_dump(exclude={"prompt_token_ids", "response_token_ids", "response_logprobs"})
    row.update(
        request=dump_json(call.request),
        response=dump_json(call.response),
        usage=None if call.usage is None else dump_json(row["usage"]),
        prompt_token_ids=pack_ints(call.prompt_token_ids),
        response_token_ids=pack_ints(call.response_token_ids),
        response_logprobs=pack_floats(call.response_logprobs),
    )
    return row


def used_bytes(conn: sqlite3.Connection) -> int:
    """The database's pages in use (the file after a checkpoint, less its free pages)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages = (
        conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    )
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def row_bytes(conn: sqlite3.Connection, rollout_id: str) -> int:
    return column_bytes(conn.execute("SELECT * FROM calls WHERE rollout_id = ?", (rollout_id,)).fetchall())


def write_version3(path: Path, rollout_id: str, calls: list[Call]) -> tuple[int, int, float]:
    """The calls written whole into a version-3 database: (row bytes, file growth, write s/call)."""
    from harnessrl.schemas import Rollout

    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("BEGIN IMMEDIATE")
    migrate_sqlite(conn, target=3)
    row = rollout_to_row(Rollout(rollout_id=rollout_id, api_key="hrl-x"))
    conn.execute(
        f"INSERT INTO rollouts ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )
    conn.execute("COMMIT")
    empty = used_bytes(conn)
    started = time.perf_counter()
    for call in calls:  # one transaction per call, as add_call commits each
        row = whole_call_row(call)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"INSERT INTO calls ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )
        conn.execute("COMMIT")
    write_s = (time.perf_counter() - started) / len(calls)
    result = row_bytes(conn, rollout_id), used_bytes(conn) - empty, write_s
    conn.close()
    return result


def read_version3(path: Path, rollout_id: str) -> float:
    """Seconds to read the rollout's version-3 rows as that version did (its ``call_from_row``)."""
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    started = time.perf_counter()
    rows = conn.execute("SELECT * FROM calls WHERE rollout_id = ? ORDER BY seq", (rollout_id,)).fetchall()
    calls = []  # kept, as list_calls returns them all
    for row in rows:
        usage = json.loads(row["usage"]) if row["usage"] is not None else None
        call = Call.model_construct(
            call_id=row["call_id"],
            rollout_id=row["rollout_id"],
            seq=row["seq"],
            attempt=row["attempt"],
            api=row["api"],
            request=json.loads(row["request"]),
            response=json.loads(row["response"]),
            prompt_token_ids=array("i", row["prompt_token_ids"]).tolist(),
            response_token_ids=array("i", row["response_token_ids"]).tolist(),
            response_logprobs=array("d", row["response_logprobs"]).tolist(),
            policy_version=row["policy_version"],
            finish_reason=row["finish_reason"],
            usage=None if usage is None else Usage(**usage),
            started_at=row["started_at"],
            first_token_at=row["first_token_at"],
            finished_at=row["finished_at"],
        )
        calls.append(call)
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


def write_current(path: Path, rollout_id: str, calls: list[Call]) -> tuple[int, int, float, float]:
    """The calls added to a fresh store of this code: (row bytes, file growth, write s/call, read s)."""
    store = SQLiteStore(path)
    store.create_rollout(rollout_id=rollout_id)
    conn = sqlite3.connect(path)
    empty = used_bytes(conn)
    started = time.perf_counter()
    for call in calls:
        store.add_call(call.model_copy(update={"seq": -1}))
    write_s = (time.perf_counter() - started) / len(calls)
    started = time.perf_counter()
    read = store.list_calls(rollout_id)
    read_s = time.perf_counter() - started
    assert read == calls
    result = row_bytes(conn, rollout_id), used_bytes(conn) - empty, write_s, read_s
    conn.close()
    store.close()
    return result


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="store-growth-") as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        store, rollout_id, timing = run_trace(tmp)
        trace_s = time.perf_counter() - started
        calls = store.list_calls(rollout_id)
        store.close()
        extends = sum(
            nxt.prompt_token_ids[: len(prev.prompt_token_ids) + len(prev.response_token_ids)]
            == prev.prompt_token_ids + prev.response_token_ids
            for prev, nxt in zip(calls, calls[1:], strict=False)
        )
        final = calls[-1]
        yardstick = 4 * (len(final.prompt_token_ids) + len(final.response_token_ids)) + len(
            dump_json(final.request)
        )
        conn = sqlite3.connect(tmp / "gateway.db")
        gateway_rows = row_bytes(conn, rollout_id)
        conn.close()
        # Costs: the best of REPEATS interleaved rounds (a shared machine's noise only adds time).
        costs: dict[str, list[float]] = {"new_write": [], "new_read": [], "old_write": [], "old_read": []}
        for i in range(REPEATS):
            new_rows, new_file, new_write_s, new_read_s = write_current(
                tmp / f"current{i}.db", rollout_id, calls
            )
            assert new_rows == gateway_rows  # the replay stores what the gateway stored
            old_rows, old_file, old_write_s = write_version3(tmp / f"v3-{i}.db", rollout_id, calls)
            old_read_s = read_version3(tmp / f"v3-{i}.db", rollout_id)
            for key, value in zip(costs, (new_write_s, new_read_s, old_write_s, old_read_s), strict=True):
                costs[key].append(value)
        new_write_s, new_read_s, old_write_s, old_read_s = (min(v) for v in costs.values())

    prompts = [len(c.prompt_token_ids) for c in calls]
    result = {
        "benchmark": "store_growth",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": load_average()},
        "trace": {
            "calls": len(calls),
            "prompt_tokens_first": prompts[0],
            "prompt_tokens_last": prompts[-1],
            "prompt_tokens_mean": round(sum(prompts) / len(prompts)),
            "response_tokens_total": sum(len(c.response_token_ids) for c in calls),
            "final_request_json_bytes": len(dump_json(final.request)),
            "calls_whose_prompt_extends_the_previous_call": f"{extends}/{len(calls) - 1}",
            "gateway": timing,
            "wall_s": round(trace_s, 1),
        },
        "yardstick_bytes": yardstick,
        "stored": {"row_bytes": new_rows, "file_growth_bytes": new_file},
        "before_version3": {"row_bytes": old_rows, "file_growth_bytes": old_file},
        "ratio_to_yardstick": {
            "stored_rows": round(new_rows / yardstick, 3),
            "stored_file": round(new_file / yardstick, 3),
            "before_rows": round(old_rows / yardstick, 2),
            "before_file": round(old_file / yardstick, 2),
        },
        "stored_vs_before_rows": round(new_rows / old_rows, 4),
        "goal": f"stored rows <= {GOAL}x the yardstick",
        "goal_met": new_rows / yardstick <= GOAL,
        "aside_costs": {
            "write_ms_per_call": {
                "stored": round(1000 * new_write_s, 2),
                "before": round(1000 * old_write_s, 2),
            },
            "read_rollout_ms": {
                "stored": round(1000 * new_read_s, 1),
                "before": round(1000 * old_read_s, 1),
            },
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    r = result["ratio_to_yardstick"]
    print(
        f"{len(calls)} calls, prompt {prompts[0]} -> {prompts[-1]} tokens (mean {result['trace']['prompt_tokens_mean']}); "
        f"yardstick {yardstick:,} B\n"
        f"stored:    {new_rows:,} B in rows ({r['stored_rows']}x), file +{new_file:,} B ({r['stored_file']}x)\n"
        f"version 3: {old_rows:,} B in rows ({r['before_rows']}x), file +{old_file:,} B ({r['before_file']}x)\n"
        f"goal {result['goal']}: {'met' if result['goal_met'] else 'NOT met'}; wrote {RESULTS}"
    )


if __name__ == "__main__":
    main()
