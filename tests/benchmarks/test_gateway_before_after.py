"""``benchmarks/gateway_before_after.py`` compares two gateways on the same path: one round, run as a
user runs it (``--before-python`` naming an interpreter), builds every prompt of both sides from the
conversation's history, and says so (``prompt_reuse``). The control: a gateway whose tokenizer is not
the one the bodies and the fake upstream use (what another Python's tiny tokenizer is) finds no
history, and ``prompt_reuse`` shows it. Timings are never asserted."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from tests.benchmarks.scripts import BENCHMARKS, load_benchmark

from harnessrl.engines.tiny import tiny_model_dir

ROOT = BENCHMARKS.parent


def test_one_round_on_a_named_python_reuses_every_history(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    args = ["--before", str(ROOT), "--before-python", sys.executable, "--legs", "chat", "--rounds", "1"]
    run = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "gateway_before_after.py"),
            *args,
            "--conversations",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["python"]["before"]["executable"] == sys.executable
    assert result["python"]["before"]["version"].startswith(sys.version.split()[0])
    for side in ("before", "after"):
        assert result["legs"]["chat"][side]["cpu_ms_per_call"]["gateway"] > 0
        reuse = result["prompt_reuse"][side]
        assert reuse.get("reused", 0) > 0 and set(reuse) <= {"first", "reused"}, reuse


def test_a_gateway_with_another_tokenizer_finds_no_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ab = load_benchmark("gateway_before_after")
    go = ab.go
    other = str(tiny_model_dir(seed=1, weights=False))  # another vocabulary, as another Python builds
    for name, value in go.OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)
    key = f"bench-{secrets.token_hex(8)}"
    with go.processes() as procs:
        port = go.free_port()
        upstream = f"http://127.0.0.1:{port}"
        procs.append(subprocess.Popen([sys.executable, str(BENCHMARKS / "gateway_overhead.py"), "--role", "upstream", "--port", str(port)]))  # fmt: skip
        go.wait_http(f"{upstream}/health", procs[-1])
        urls = {
            "same": ab.start_gateway(procs, ROOT, upstream, tmp_path, key, tokenizer=str(tiny_model_dir(weights=False))),
            "other": ab.start_gateway(procs, ROOT, upstream, tmp_path, key, tokenizer=other),
        }  # fmt: skip

        async def one_conversation_each() -> dict[str, dict[str, float]]:
            import aiohttp

            bodies = go.leg_bodies(go.build_reply(go._tokenizer()), 1)["chat"]
            async with aiohttp.ClientSession() as session:
                for url in urls.values():
                    await go.run_batch(session, go.Harnessrl(url, key, "chat"), bodies, 1, 1)
            return await ab.prompt_reuse(urls, key)

        reuse = asyncio.run(one_conversation_each())
    assert reuse["same"].get("reused", 0) == go.TURNS - 1 and "no_match" not in reuse["same"], reuse
    assert reuse["other"].get("no_match", 0) > 0 and "reused" not in reuse["other"], reuse
