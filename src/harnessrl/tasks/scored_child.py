"""Running the code under test from a scorer: ``run_child`` (through ``run_scored``, or plainly for
trusted code) and ``inputs_exposed`` (would the scored code's domain reach a scorer's secret?).

Shared by ``harnessrl.tasks.pytest_scoring`` (pytest over a repository's tests) and the coding tasks'
probes (``harnessrl.tasks.coding.probes``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harnessrl.sandbox import landlock
from harnessrl.sandbox.scored import domain_spec, run_scored

INPUTS_EXPOSED = "scorer_inputs_exposed"  # flag: the scored code could read what the scorer keeps from it
# The scored process's environment: nothing of the scorer's beyond these.
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ")


@dataclass(frozen=True)
class ChildRun:
    """How a child that ran the code under test ended; ``output`` is untrusted."""

    exit_code: int | None  # None when killed at the time limit
    timed_out: bool
    output: bytes
    isolation: str  # run_scored's ("landlock", ...) or "none" (a trusted child, not isolated)
    leftovers: int = 0  # processes it left behind, killed before the run returned


def child_env(home: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(HOME=str(home), TMPDIR=str(home), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return env


def run_child(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    stdin: bytes = b"",
    writable: Sequence[Path] = (),
    isolated: bool = True,
    output_limit: int = 1 << 16,
    readable: Sequence[Path] = (),
) -> ChildRun:
    """Run ``argv`` over code under test: through ``run_scored`` (``isolated``, what scorers do), or as
    a plain process group for trusted code (the task builder's runs of gold and mutant code, which
    run several at once: ``run_scored`` kills every descendant of its caller)."""
    if isolated:
        run = run_scored(
            argv,
            cwd=cwd,
            env=env,
            timeout_s=timeout_s,
            writable=writable,
            readable=readable,
            stdin=stdin,
            output_limit=output_limit,
        )
        return ChildRun(run.exit_code, run.timed_out, run.output, run.isolation, run.leftovers)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout:
        fin.write(stdin)
        fin.seek(0)
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=fin, stdout=fout, stderr=subprocess.STDOUT, start_new_session=True
        )
        code: int | None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if code is not None and code < 0:
            code = 128 - code  # killed by a signal, as run_scored reports it
        fout.seek(max(0, fout.tell() - output_limit))
        output = fout.read()
    return ChildRun(code, code is None, output, "none")


def inputs_exposed(secrets: Sequence[Path], *, cwd: Path, writable: Sequence[Path] = ()) -> list[str]:
    """Which of ``secrets`` the scored code's domain (``run_scored`` with these arguments) could read:
    all of them without Landlock; with it, those beneath a folder the domain allows (``/tmp``, the
    workspace, Python's install...). The evaluator's layout keeps inputs under ``/run/harnessrl``."""
    abi = landlock.abi_version()
    if abi < 1:
        return [str(p) for p in secrets]
    spec = domain_spec(cwd=cwd, readable=(), writable=writable, abi=abi)
    roots = [Path(os.path.realpath(p)) for p in spec["rules"]]
    found = []
    for secret in secrets:
        real = Path(os.path.realpath(secret))
        if any(real == root or real.is_relative_to(root) for root in roots):
            found.append(str(secret))
    return found
