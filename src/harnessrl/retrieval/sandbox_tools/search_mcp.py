"""The retriever as an MCP server (the official ``mcp`` SDK, stdio transport), run inside a harness's
sandbox by the harness itself (its MCP client starts this file; the presets configure it).

One tool, ``search(query, top_k=None)``, which asks the rollout's search route on the gateway exactly as
the ``search`` command does (``search_client.py`` beside this file, loaded by path: the sandbox binds
these two files, not the project). The base URL and key come from ``--base-url`` / ``--api-key``
(the presets pass the rollout's) or ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``: MCP clients start
servers with a trimmed environment, so the arguments are the dependable way.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path


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
        except RuntimeError as exc:
            return f"Error: {exc}"
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
    build_server(args.base_url, args.api_key).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
