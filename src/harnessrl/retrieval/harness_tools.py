"""Where the sandbox-side faces of the retriever live, and how a harness gets them.

- ``search`` (a shell command: ``sandbox_tools/search_client.py``): a two-line ``sh`` wrapper named
  ``search`` in a folder of its own, which the preset puts first on the harness's ``PATH``;
- the MCP server (``sandbox_tools/search_mcp.py``), started by the harness's own MCP client with
  ``mcp_server_argv`` (harnessrl's Python, ``-I``, the script, the rollout's base URL and key as
  ``{base_url}`` / ``{api_key}`` placeholders the controller fills per rollout).

The sandbox binds exactly these files read-only (``tool_mounts``); nothing else of the project. The
wrapper folder is written once per machine with fixed content, like the presets' config files.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

from harnessrl.sandbox.host import private_temp_folder

TOOLS = Path(__file__).with_name("sandbox_tools")
CLIENT = TOOLS / "search_client.py"
MCP_SERVER = TOOLS / "search_mcp.py"
#: The MCP server's name in every harness's config: Claude Code calls its tool ``mcp__harnessrl__search``.
MCP_NAME = "harnessrl"


def _wrapper() -> str:
    return f'#!/bin/sh\nexec "{sys.executable}" -I "{CLIENT}" "$@"\n'


def search_bin_dir(base: Path | None = None) -> Path:
    """The folder holding the ``search`` wrapper (made or refreshed here): ``base/harnessrl-tools/bin``,
    else ``<temp>/harnessrl-tools-<uid>/<content hash>/bin`` (private to this user, and one per
    interpreter: two installs of harnessrl no longer rewrite one wrapper in turn under each other's
    running rollouts). Rewritten only when its content changed, so concurrent rollouts read a whole
    file. Safe from several threads and processes at once: each writer writes a temp file of its own
    and renames it into place (the last rename wins, with the same content)."""
    content = _wrapper()
    if base is None:
        digest = hashlib.sha256(content.encode()).hexdigest()[:16]
        folder = (
            private_temp_folder(
                "harnessrl-tools",
                field="harness.tools",
                remedy="remove it, or set HARNESSRL_HARNESSES_DIR to a folder of your own",
            )
            / digest
            / "bin"
        )
    else:
        folder = base / "harnessrl-tools" / "bin"
    path = folder / "search"
    if not path.is_file() or path.read_text() != content:
        folder.mkdir(parents=True, exist_ok=True)
        # A unique name, not one per pid: threads of one process renamed each other's file away.
        fd, tmp_name = tempfile.mkstemp(prefix=".search.", suffix=".tmp", dir=folder)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
            tmp.chmod(0o755)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # left only when writing failed
    return folder


def tool_mounts(bin_dir: Path) -> list[str]:
    """What the sandbox must bind (read-only) for both faces to run."""
    return [str(bin_dir.resolve()), str(CLIENT.resolve()), str(MCP_SERVER.resolve())]


def mcp_server_argv() -> list[str]:
    """The MCP server's command line, with the rollout's placeholders."""
    return [sys.executable, "-I", str(MCP_SERVER), "--base-url", "{base_url}", "--api-key", "{api_key}"]
