"""Isolation with the retriever running: a hostile harness (``probe.py``) in the real sandbox, through
``harnessrl rollout`` with ``[retrieval]`` and ``harness.tools = ["search"]``.

Inside the sandbox the search command works (the relay reaches the retriever), and nothing else does:
the red team's network probes (a Python socket and curl to a port on the host's loopback) fail, the
corpus file, the index folder and a secret beside the corpus cannot be read, no query (paths, the
secret itself) returns anything but corpus passages, a huge query is a 413, and a flood of searches
is answered 200 or 429 with the gateway alive after it. The control runs the same harness with
``sandbox = "none"``: there the network probes and the file reads succeed, which shows each probe
notices success.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from harnessrl.controller.sandbox_check import LoopbackListener
from harnessrl.retrieval.corpus import fingerprint
from harnessrl.sandbox.bwrap import sandbox_problem
from harnessrl.store.sqlite import SQLiteStore

from .conftest import PASSAGES, write_corpus
from .rollout_configs import scripted_rollout_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's cgroups need root here"),
    pytest.mark.skipif(sandbox_problem() is not None, reason=f"no sandbox here: {sandbox_problem()}"),
]

PROBE = Path(__file__).with_name("probe.py")
# What only the sandbox stops: each must fail inside it and succeed in the control.
STOPPED_BY_THE_SANDBOX = {
    "python_socket_to_a_host_port",
    "curl_to_a_host_port",
    "read_the_corpus_file",
    "read_the_index_folder",
    "read_the_secret_beside_the_corpus",
}
# What the retriever itself stops: fails in both runs.
STOPPED_BY_THE_RETRIEVER = {"secret_through_path_tricks_in_queries", "flood_crashes_the_gateway"}


def run_probe(tmp_path: Path, sandbox: str) -> tuple[dict, int]:
    secret_text = f"SECRET{secrets.token_hex(8)}"
    data = tmp_path / "data"
    data.mkdir()
    corpus = write_corpus(data / "corpus.jsonl", PASSAGES)
    (data / "secret.txt").write_text(secret_text + "\n")
    cache = tmp_path / "cache"
    listener = LoopbackListener(b"LEAKED")
    task = {
        "prompt": "probe",
        "targets": {
            "listener_port": listener.port,
            "corpus": str(corpus),
            "index_dir": str(cache / fingerprint(corpus)),
            "secret_path": str(data / "secret.txt"),
            "secret_reversed": secret_text[::-1],
        },
        "hidden": {"answer": "unused"},  # exact_match needs a gold; the probe's reward is not read
    }
    config = scripted_rollout_config(
        tmp_path,
        "probe.toml",
        f"""
[retrieval]
corpus = "{corpus}"
cache_dir = "{cache}"
rate_per_s = 5
burst = 20

[harness]
preset = "python"
command = ["{PROBE}"]
tools = ["search"]
timeout_s = 180
sandbox = "{sandbox}"

[evaluator]
type = "exact_match"

[controller]
max_infra_retries = 0
""",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", json.dumps(task)]
        + ["--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    stdout = (Path(summary["log"]) / "stdout.log").read_text()
    report = json.loads(next(line for line in stdout.splitlines() if line.startswith('{"probes"')))["probes"]
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    try:
        searches = len(store.list_tool_requests(summary["rollout_id"]))
    finally:
        store.close()
    assert listener.connections == 0 or sandbox == "none"
    return report, searches


def test_inside_the_sandbox_only_the_search_tool_gets_out(tmp_path: Path) -> None:
    report, searches = run_probe(tmp_path, "bwrap")
    assert report["search_command_works"]["succeeded"], report["search_command_works"]
    assert report["huge_query_refused"]["succeeded"], report["huge_query_refused"]
    leaked = {
        n: r["evidence"]
        for n, r in report.items()
        if n in STOPPED_BY_THE_SANDBOX | STOPPED_BY_THE_RETRIEVER and r["succeeded"]
    }
    assert leaked == {}
    # Every search the gateway served was recorded; the flood was mostly refused (burst 20, 5/s).
    assert 1 < searches < 400


def test_control_without_the_sandbox_the_probes_succeed(tmp_path: Path) -> None:
    report, _ = run_probe(tmp_path, "none")
    missed = {n: report[n]["evidence"] for n in STOPPED_BY_THE_SANDBOX if not report[n]["succeeded"]}
    assert missed == {}, f"probes that did not notice a working attack: {missed}"
    for name in STOPPED_BY_THE_RETRIEVER:  # the retriever's own defences hold without the sandbox too
        assert not report[name]["succeeded"], report[name]
