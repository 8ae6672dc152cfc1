"""The MCP server as a harness runs it: its own process on stdio (``mcp_server_argv``), asked by the
official ``mcp`` client or by raw JSON-RPC lines, against a real gateway. A refused or failed search
is a tool error (``isError``), and a request no JSON parser of the SDK accepts as text (a lone
surrogate escape) is still answered."""

from __future__ import annotations

import asyncio
import io
import json
import queue
import socket
import subprocess
import threading
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from harnessrl.retrieval import harness_tools
from harnessrl.retrieval.sandbox_tools.search_mcp import SurrogateSafeReader


def server_argv(base_url: str, api_key: str) -> list[str]:
    filled = {"{base_url}": base_url, "{api_key}": api_key}
    return [filled.get(arg, arg) for arg in harness_tools.mcp_server_argv()]


def call_over_stdio(argv: list[str], calls: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    """``(is_error, text)`` of each ``search`` call, asked through the official client in order."""

    async def run() -> list[tuple[bool, str]]:
        params = StdioServerParameters(command=argv[0], args=argv[1:])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            results = []
            for arguments in calls:
                result = await session.call_tool("search", arguments, read_timeout_seconds=60)
                results.append((bool(result.is_error), result.content[0].text))
            return results

    return asyncio.run(run())


def test_a_refused_or_failed_search_is_a_tool_error(make_search_gateway) -> None:
    # Refusals came back as successful results reading "Error: ...": the model could not tell.
    gw = make_search_gateway(rate_per_s=0.001, burst=4, max_query_chars=20)
    rollout = gw.rollout()
    results = call_over_stdio(
        server_argv(rollout["base_url"], rollout["api_key"]),
        [{"query": q} for q in ["Velmora", " ", "Velmora " * 3, "Tarsk", "Velmora"]],  # 4 fit the burst
    )
    assert [is_error for is_error, _ in results] == [False, True, True, False, True], results
    assert results[0][1].startswith("[1] Velmora") and results[3][1].startswith("[1] Tarsk")  # control
    for (_, text), status in zip(results[1:3] + results[4:], ["400", "413", "429"], strict=True):
        assert f"refused ({status})" in text, text
    wrong_key = call_over_stdio(server_argv(rollout["base_url"], "hrl-wrong"), [{"query": "Velmora"}])
    assert wrong_key[0][0] and "refused (401)" in wrong_key[0][1], wrong_key
    # No gateway at all: a port bound here but not listening refuses the connection.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{closed.getsockname()[1]}/rollouts/r/v1"
        unreachable = call_over_stdio(server_argv(base_url, "hrl-any"), [{"query": "Velmora"}])
    assert unreachable[0][0] and "search failed" in unreachable[0][1], unreachable


class RawServer:
    """The server process spoken to in raw JSON-RPC lines, which the official client cannot write
    (a lone surrogate); its answers read by a thread into a queue."""

    def __init__(self, argv: list[str]):
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)  # the server closed its output

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def answers_to(self, ids: set[int], within_s: float = 60) -> dict[int, dict[str, Any]]:
        """The answers to ``ids``; fails if the server closes, or has not answered them all within
        ``within_s`` (a request it dropped is never answered: this bounds the wait, it times nothing)."""
        found: dict[int, dict[str, Any]] = {}
        while not ids <= found.keys():
            try:
                answer = self.answers.get(timeout=within_s)
            except queue.Empty:
                raise AssertionError(f"never answered: {sorted(ids - found.keys())}") from None
            assert answer is not None, f"the server closed; never answered {sorted(ids - found.keys())}"
            if "id" in answer:
                found[answer["id"]] = answer
        return found

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # end of input: the server exits
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


def search_line(request_id: int, query_json: bytes) -> bytes:
    """A tools/call line whose query is ``query_json``, the JSON string's text as written."""
    return (
        b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "search", '
        b'"arguments": {"query": %s}}}' % (request_id, query_json)
    )


def test_a_request_with_a_lone_surrogate_escape_is_answered(make_search_gateway) -> None:
    gw = make_search_gateway()
    rollout = gw.rollout()
    server = RawServer(server_argv(rollout["base_url"], rollout["api_key"]))
    try:
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        server.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}).encode())
        assert "result" in server.answers_to({1})[1]
        server.send(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
        server.send(search_line(2, b'"Velmora \\ud800"'))  # dropped unanswered before
        server.send(search_line(3, b'"\\udfff\\ud800 Velmora \\ud83d"'))  # a reversed pair: two lone ones
        server.send(search_line(4, b'"\\ud83d\\ude00 Velmora"'))  # control: a valid pair, an emoji
        server.send(search_line(5, b'"Velmora \\\\ud800"'))  # control: an escaped backslash, then text
        answers = server.answers_to({2, 3, 4, 5})
    finally:
        server.close()
    for request_id in (2, 3, 4, 5):
        result = answers[request_id]["result"]
        assert not result.get("isError") and result["content"][0]["text"].startswith("[1] Velmora"), result
    logged = [r.request["query"] for r in gw.store.list_tool_requests(rollout["rollout_id"])]
    assert sorted(logged) == sorted(
        ["Velmora \ufffd", "\ufffd\ufffd Velmora \ufffd", "\N{GRINNING FACE} Velmora", "Velmora \\ud800"]
    )


def test_only_lone_surrogate_escapes_are_replaced_whatever_surrounds_them() -> None:
    cases = {  # a JSON string as written -> the string read through the reader
        b'"a \\ud800 b"': "a \ufffd b",
        b'"\\uDBFF\\uDFFF"': "\U0010ffff",  # a pair in capitals: kept
        b'"\\ude00\\ud83d"': "\ufffd\ufffd",  # reversed: two lone ones
        b'"\\ud83d\\u0041"': "\ufffdA",  # a high one before a letter
        b'"\\\\ud800"': "\\ud800",  # an escaped backslash, then text
        b'"\\\\\\ud800"': "\\\ufffd",  # an escaped backslash, then a lone escape
        b'"\\"\\ud800\\n"': '"\ufffd\n',
        b'"' + b"x" * 20_000 + b'\\udfff"': "x" * 20_000 + "\ufffd",  # past one buffer's read
    }
    source = io.BytesIO(b"".join(line + b"\n" for line in cases))
    lines = io.TextIOWrapper(io.BufferedReader(SurrogateSafeReader(source)), encoding="utf-8")
    assert [json.loads(line) for line in lines] == list(cases.values())
