"""The two faces as the presets hand them to a harness: the `search` command first on PATH (run here
against a real gateway), and the MCP server in Claude Code's, Codex's and OpenCode's own flags or
config, with the rollout's placeholders; the sandbox binds only their files. Without
``harness.tools`` nothing of it is added (the control)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import tomllib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.presets import apply_preset
from harnessrl.controller.stack import RolloutConfig, prepare
from harnessrl.errors import ConfigError
from harnessrl.retrieval import harness_tools
from harnessrl.retrieval.config import RetrievalConfig
from harnessrl.retrieval.sandbox_tools import search_client, search_mcp

SERVER = str(harness_tools.MCP_SERVER)


def mcp_args(spec: HarnessSpec) -> list[str]:
    preset = spec.preset
    if preset == "claude-code":
        config = json.loads(spec.command[spec.command.index("--mcp-config") + 1])
        server = config["mcpServers"]["harnessrl"]
        return [server["command"], *server["args"]]
    if preset == "codex":
        values = {}
        for item in spec.command:
            if item.startswith("mcp_servers.harnessrl."):
                values.update(tomllib.loads(item.replace("mcp_servers.harnessrl.", "", 1)))
        return [values["command"], *values["args"]]
    config = json.loads(spec.env["OPENCODE_CONFIG_CONTENT"])
    assert config["mcp"]["harnessrl"]["type"] == "local"
    return config["mcp"]["harnessrl"]["command"]


@pytest.mark.parametrize("preset", ["claude-code", "codex", "opencode"])
def test_tool_calling_presets_start_the_mcp_server_with_the_rollouts_url_and_key(preset: str) -> None:
    spec = apply_preset(HarnessSpec(preset=preset, tools=["search"]))
    argv = mcp_args(spec)
    assert argv[1:] == ["-I", SERVER, "--base-url", "{base_url}", "--api-key", "{api_key}"]
    assert Path(argv[0]).is_file()
    assert {str(harness_tools.MCP_SERVER.resolve()), str(harness_tools.CLIENT.resolve())} <= set(spec.mounts)
    plain = apply_preset(HarnessSpec(preset=preset))  # control: no tools, no server, no mounts
    assert SERVER not in json.dumps(plain.model_dump())


@pytest.mark.parametrize("preset", ["mini-swe-agent", "claude-code", None])
def test_every_harness_gets_the_search_command_first_on_path(preset: str | None) -> None:
    spec = apply_preset(HarnessSpec(preset=preset, command=[] if preset else ["true"], tools=["search"]))
    first = Path(spec.env["PATH"].split(":")[0])
    assert (first / "search").is_file() and os.access(first / "search", os.X_OK)
    assert str(first.resolve()) in spec.mounts
    assert "PATH" not in apply_preset(HarnessSpec(preset=preset, command=[] if preset else ["true"])).env


def test_the_search_wrapper_is_written_safely_by_threads_racing(tmp_path: Path) -> None:
    # Concurrent rollouts of one process each make the folder: the temp file's name was the pid's,
    # so one thread renamed another's away (FileNotFoundError in 72 of 240 such races).
    threads, trials = 8, 30

    def make(base: Path, start: threading.Barrier) -> Path:
        start.wait(30)  # all at once
        return harness_tools.search_bin_dir(base)

    for trial in range(trials):
        base = tmp_path / str(trial)  # a fresh folder: every thread finds no wrapper and writes one
        start = threading.Barrier(threads)
        with ThreadPoolExecutor(threads) as pool:
            folders = list(pool.map(make, [base] * threads, [start] * threads))
        folder = base / "harnessrl-tools" / "bin"
        assert folders == [folder] * threads
        assert os.listdir(folder) == ["search"]  # no temp file left behind
        assert (folder / "search").read_text().endswith(f'"{harness_tools.CLIENT}" "$@"\n')
        assert os.access(folder / "search", os.X_OK)


def test_the_search_tool_needs_a_retrieval_section(tmp_path: Path) -> None:
    harness = HarnessSpec(preset="python", command=["/bin/true"], tools=["search"], sandbox="none")
    with pytest.raises(ConfigError, match=r"harness\.tools.*\[retrieval\]"):
        prepare(RolloutConfig(harness=harness), tmp_path / "run")


def test_the_search_command_prints_passages_from_the_gateway(make_search_gateway) -> None:
    gw = make_search_gateway()
    rollout = gw.rollout()
    spec = apply_preset(HarnessSpec(preset="python", command=["x"], tools=["search"]))
    env = {
        "PATH": spec.env["PATH"],
        "OPENAI_BASE_URL": rollout["base_url"],
        "OPENAI_API_KEY": rollout["api_key"],
    }
    done = subprocess.run(
        ["search", "who founded Velmora"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[1] Velmora\nVelmora is a city founded in 1432 by Arlen Voss.")
    [logged] = gw.store.list_tool_requests(rollout["rollout_id"])
    assert logged.request["query"] == "who founded Velmora"
    refused = subprocess.run(
        ["search", "Velmora"],
        env={**env, "OPENAI_API_KEY": "hrl-wrong"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "refused (401)" in refused.stderr  # control: a wrong key


def test_docs_name_every_retrieval_setting() -> None:
    from harnessrl.retrieval.config import RetrievalConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "retrieval.md").read_text()
    assert [name for name in RetrievalConfig.model_fields if f"`{name}`" not in text] == []


def test_the_retrieval_top_k_may_not_exceed_max_top_k() -> None:
    # Else every search that does not name a number asks for more than the route allows: all 400s.
    with pytest.raises(
        ValidationError, match=r"retrieval\.top_k \(20\) must not exceed retrieval\.max_top_k \(10\)"
    ):
        RetrievalConfig(corpus="c.jsonl", top_k=20)
    assert RetrievalConfig(corpus="c.jsonl", top_k=20, max_top_k=20).top_k == 20  # control


def test_the_mcp_tool_asks_for_the_runs_top_k_unless_the_model_names_one(make_search_gateway) -> None:
    gw = make_search_gateway(top_k=2)
    rollout = gw.rollout()
    server = search_mcp.build_server(rollout["base_url"], rollout["api_key"])

    async def call(arguments: dict) -> str:
        result = await server.call_tool("search", arguments)
        return result.content[0].text

    assert asyncio.run(call({"query": "Velmora"})).startswith("[1] Velmora")
    assert asyncio.run(call({"query": "Velmora", "top_k": 1})).startswith("[1] Velmora")
    logged = gw.store.list_tool_requests(rollout["rollout_id"])
    assert [r.request["top_k"] for r in logged] == [2, 1]  # the run's retrieval.top_k, then the model's


def test_the_search_client_sends_utf8_not_json_escapes() -> None:
    bodies: list[bytes] = []

    class Capture(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            answer = json.dumps({"query": "", "passages": []}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Capture)  # this machine's loopback only
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/rollouts/r/v1"
        waves = "\N{WATER WAVE}" * 508 + " Keth"  # the hunter's query: 413 when escaped (12 bytes each)
        search_client.search(waves, base_url=base, api_key="k")
        # argv's undecodable bytes are lone surrogates: still sent (as an escape), for the route to refuse
        search_client.search("\udcff Keth", base_url=base, api_key="k")
    finally:
        server.shutdown()
        server.server_close()
    assert [json.loads(body)["query"] for body in bodies] == [waves, "\udcff Keth"]
    size = len(bodies[0])
    assert size <= 4 * len(waves) + 32  # UTF-8: 4 bytes a wave


@pytest.mark.parametrize(
    ("status", "declared", "body", "named"),
    [
        (200, 1000, b'{"query": "Velmora", "passages": [', "IncompleteRead"),  # cut short mid-answer
        (429, 1000, b'{"error": {"mess', "refused (429)"),  # a refusal cut short
        (200, None, b"<html>proxy error</html>", "not JSON"),
        (200, None, b'{"passages": [{"title": 7}]}', "holds no passages"),
        (200, None, b"[1, 2]", "holds no passages"),
    ],
)
def test_the_search_command_names_a_broken_answer_instead_of_a_traceback(
    status: int, declared: int | None, body: bytes, named: str
) -> None:
    """An answer cut short (the connection closed before its ``content-length``; a refusal's body
    too) was an ``IncompleteRead`` traceback, one that is not JSON or not passages a ``ValueError``'s
    or ``TypeError``'s: the agent read a Python traceback as the tool's output. Now exit 1 naming it."""

    class Broken(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(status)
            self.send_header("content-length", str(declared or len(body)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Broken)  # this machine's loopback only
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    spec = apply_preset(HarnessSpec(preset="python", command=["x"], tools=["search"]))
    env = {
        "PATH": spec.env["PATH"],
        "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/rollouts/r/v1",
        "OPENAI_API_KEY": "k",
    }
    try:
        done = subprocess.run(["search", "Velmora"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.startswith("search: search ")
    assert named in done.stderr
