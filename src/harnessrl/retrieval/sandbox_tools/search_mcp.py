"""The retriever as an MCP server (the official ``mcp`` SDK, stdio transport), run inside a harness's
sandbox by the harness itself (its MCP client starts this file; the presets configure it).

One tool, ``search(query, top_k=None)``, which asks the rollout's search route on the gateway exactly as
the ``search`` command does (``search_client.py`` beside this file, loaded by path: the sandbox binds
these two files, not the project). The base URL and key come from ``--base-url`` / ``--api-key``
(the presets pass the rollout's) or ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: MCP clients start
servers with a trimmed environment, so the arguments are the dependable way.

A search the gateway refuses (400, 401, 413, 429) or cannot be asked (no connection) is a tool error
(``isError``), with the gateway's reason as its text, never a result that looks like passages. A
request holding a lone surrogate escape (``"\\ud800"``, which the SDK's reader cannot parse and drops
unanswered) is read with U+FFFD in its place (``SurrogateSafeReader``).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import re
import sys
from pathlib import Path

#: In JSON text, left to right: a surrogate pair (kept), a lone surrogate escape (replaced), or any
#: other escape (kept; matched so that \\ud800, an escaped backslash then "ud800", is not read
#: as a surrogate). A backslash is one byte in UTF-8 and never inside a multi-byte character.
_ESCAPE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
    rb"|\\."
)


def _replace_lone_surrogate(match: re.Match[bytes]) -> bytes:
    return b"\\ufffd" if match.group(1) else match.group(0)


class SurrogateSafeReader(io.RawIOBase):
    """``stdin`` for the SDK's stdio reader, a JSON-RPC message a line: each line with its lone
    surrogate escapes (``\\ud800``-``\\udfff`` not in a pair) written as ``\\ufffd``. The SDK's
    parser refuses such a line and drops the request unanswered, so a client waits forever.

    It has no ``fileno`` on purpose: the SDK then reads this object rather than fd 0 itself (it does
    not divert fd 0 to /dev/null while serving, which only matters to children, and this server
    starts none)."""

    def __init__(self, source: io.BufferedIOBase):
        self._source = source
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  (any writable buffer)
        if not self._pending:
            line = self._source.readline()
            if not line:
                return 0  # end of input
            self._pending = _ESCAPE.sub(_replace_lone_surrogate, line) if b"\\" in line else line
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _client():  # search_client.py beside this file, without putting its folder on sys.path
    spec = importlib.util.spec_from_file_location(
        "harnessrl_search_client", Path(__file__).with_name("search_client.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_server(base_url: str, api_key: str):  # -> MCPServer
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    client = _client()
    server = MCPServer("harnessrl", instructions="Search the document corpus for passages.")

    @server.tool(
        name="search",
        description="Search the corpus. Returns the best-matching passages, each with its title. "
        "top_k: how many passages (leave it out for the default).",
    )
    def search(query: str, top_k: int | None = None) -> str:
        # top_k is sent only when the model gives one: else the gateway's retrieval.top_k applies.
        try:
            answer = client.search(query, base_url=base_url, api_key=api_key, top_k=top_k)
        except RuntimeError as exc:  # refused or unreachable: an isError result, the reason its text
            raise ToolError(str(exc)) from None
        return client.format_passages(answer.get("passages", []))

    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="search-mcp", description="The corpus search tool as an MCP server (stdio)."
    )
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", ""))
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
    args = parser.parse_args(argv)
    if not args.base_url or not args.api_key:
        print("search-mcp: no gateway (pass --base-url and --api-key)", file=sys.stderr)
        return 2
    sys.stdin = io.TextIOWrapper(io.BufferedReader(SurrogateSafeReader(sys.stdin.buffer)), encoding="utf-8")
    build_server(args.base_url, args.api_key).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
