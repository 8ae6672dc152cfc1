"""The command evaluator's process runner: placeholders filled, environment built, argv run.

``CommandEvaluator`` (in ``evaluators``) renders its argv with ``fill_placeholders``, starts from
``inherited_env()`` (a short allow-list: the controller's secrets, such as the admin key, never
reach the scorer) and runs it with ``run_command``: in its own process group, killed as a group on
timeout and once it exits, output written to files of which only the tail is read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

from harnessrl.controller.evaluator_types import EvaluatorError

_PLACEHOLDER = re.compile(r"\{(workspace|task_file|rollout_id|prompt|task\[([^\]\}]+)\])\}")
# Passed through from the controller's environment; everything else (the admin key) is dropped.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR")
_OUTPUT_LIMIT = 1 << 20  # bytes of stdout/stderr kept (the tail): a chatty test suite can't exhaust memory


def inherited_env() -> dict[str, str]:
    """The variables of the controller's environment that an evaluator command may see."""
    return {k: os.environ[k] for k in _INHERITED_ENV if k in os.environ}


def fill_placeholders(template: str, values: dict[str, Any]) -> str:
    """Replace known placeholders only, so shell ``${X}`` and JSON braces pass through."""

    def substitute(match: re.Match[str]) -> str:
        name, key = match.group(1), match.group(2)
        value = values["task"].get(key) if key is not None else values.get(name)
        if value is None:
            raise EvaluatorError(f"evaluator template {match.group(0)}: the task has no such field")
        return value if isinstance(value, str) else json.dumps(value)

    return _PLACEHOLDER.sub(substitute, template)


async def run_command(
    argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float, scratch: Path
) -> tuple[int, str, str]:
    """Run ``argv`` in its own process group; kill the whole group on timeout and once it exits.

    Output goes to files in ``scratch``, not pipes: test suites leave servers behind that would hold
    a pipe open (and asyncio's ``wait()`` waits for the pipes), and a file's tail is cheap to read.
    """
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    with out_path.open("wb") as out_fh, err_path.open("wb") as err_fh:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_fh,
                stderr=err_fh,
                start_new_session=True,
            )
        except OSError as exc:
            raise EvaluatorError(f"cannot start evaluator command {argv[0]!r}: {exc}") from exc
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError as exc:
            raise EvaluatorError(f"evaluator command timed out after {timeout_s:g}s") from exc
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, _tail(out_path), _tail(err_path)


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - _OUTPUT_LIMIT))
        return fh.read().decode(errors="replace")
