"""Fast screening of candidate solutions against a test module, in a throwaway worker process.

Building a task set tries many mutants per problem; running pytest for each would take minutes.
``screen`` starts one worker (``python -I -m harnessrl.tasks.coding.screen``) per batch of
candidates; the worker imports each candidate as the module ``solution``, executes the test module
and calls every ``test_*`` function with a per-test time limit, and prints one JSON line per
candidate. Probes (``{test name: function source}``) evaluate a failing check's call to report what
the buggy function actually returns, for the problem statement.

A candidate that loops forever inside code that swallows the timer's exception stalls the worker:
the parent kills it at a batch deadline, marks that candidate ``stalled`` and starts a new worker
for the rest. Screening only picks candidates; the build confirms its choice with real pytest runs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import types
from dataclasses import dataclass
from typing import Any

_MEMORY_LIMIT = 2 << 30  # bytes of address space for the worker: a mutant allocating a huge list fails


@dataclass(frozen=True)
class Screened:
    outcomes: dict[str, str]  # test name -> passed | failed | timeout
    probes: dict[str, str]  # test name -> "returns <repr>" | "raises <Exception>"
    stalled: bool = False

    @property
    def failed(self) -> list[str]:
        return [name for name, outcome in self.outcomes.items() if outcome != "passed"]

    @property
    def clean(self) -> bool:
        """Every test finished in time (a slow or hanging candidate makes a poor task)."""
        return not self.stalled and "timeout" not in self.outcomes.values()


def screen(
    solutions: list[str],
    test_module: str,
    probes: dict[str, str] | None = None,
    *,
    timeout_s: float = 2.0,
    stop_when: int | None = None,
) -> list[Screened | None]:
    """Screen ``solutions`` in order. With ``stop_when=K`` the worker stops after K candidates that
    fail some but not all tests; the remaining entries are ``None`` (not screened)."""
    results: list[Screened | None] = [None] * len(solutions)
    start = 0
    while start < len(solutions):
        request = {
            "solutions": solutions[start:],
            "test_module": test_module,
            "probes": probes or {},
            "timeout_s": timeout_s,
            "stop_when": stop_when,
            "already": sum(1 for r in results if r is not None and _mixed(r)),
        }
        # Generous: a healthy candidate needs milliseconds per test, a hanging one one timer period.
        deadline = 60 + timeout_s * 4 * len(solutions[start:])
        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "harnessrl.tasks.coding.screen"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(json.dumps(request), timeout=deadline)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        done = 0
        for line in out.splitlines():
            row = json.loads(line)
            results[start + row["index"]] = Screened(row["outcomes"], row["probes"])
            done = row["index"] + 1
        if proc.returncode == 0 and (done == len(solutions) - start or stop_when is not None):
            break
        if start + done >= len(solutions):  # every candidate answered; the worker died on its way out
            break
        # The worker died or stalled on candidate start+done: record that and go on after it.
        results[start + done] = Screened({}, {}, stalled=True)
        start += done + 1
    return results


def _mixed(result: Screened) -> bool:
    return result.clean and 0 < len(result.failed) < len(result.outcomes)


# --------------------------------------------------------------------------------------------------
# The worker
# --------------------------------------------------------------------------------------------------


class _Timeout(BaseException):  # not an Exception: a candidate's `except Exception` cannot swallow it
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _timed(fn: Any, timeout_s: float) -> tuple[str, Any]:
    signal.setitimer(signal.ITIMER_REAL, timeout_s, timeout_s)  # re-arms: a swallowed tick fires again
    try:
        return "passed", fn()
    except _Timeout:
        return "timeout", None
    except BaseException as exc:  # noqa: BLE001 (SystemExit, KeyboardInterrupt from a candidate: a failure)
        return "failed", exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _screen_one(source: str, request: dict[str, Any]) -> dict[str, Any]:
    timeout_s = request["timeout_s"]
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    status, _ = _timed(lambda: exec(compile(source, "solution.py", "exec"), module.__dict__), timeout_s)
    namespace: dict[str, Any] = {"__name__": "test_solution"}
    if status == "passed":
        status, _ = _timed(
            lambda: exec(compile(request["test_module"], "test_solution.py", "exec"), namespace), timeout_s
        )
    names = sorted(n for n in namespace if n.startswith("test_") and callable(namespace[n]))
    if status != "passed":  # the module itself failed: every test fails
        names = sorted(n for n in _test_names(request["test_module"]))
        return {"outcomes": {n: status for n in names}, "probes": {}}
    outcomes, probes = {}, {}
    for name in names:
        random.seed(0)  # as the test module's autouse fixture does under pytest
        outcomes[name], _ = _timed(namespace[name], timeout_s)
        probe = request["probes"].get(name)
        if outcomes[name] == "failed" and probe is not None:
            scope = dict(namespace)
            code = compile(probe, "probe.py", "exec")
            status, _ = _timed(lambda code=code, scope=scope: exec(code, scope), timeout_s)
            if status == "passed":
                random.seed(0)
                status, value = _timed(scope["__probe__"], timeout_s)
                if status == "passed":
                    probes[name] = "returns " + _short(repr(value))
                elif status == "failed":
                    probes[name] = "raises " + type(value).__name__
    return {"outcomes": outcomes, "probes": probes}


def _test_names(test_module: str) -> list[str]:
    import ast

    return [
        n.name
        for n in ast.parse(test_module).body
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    ]


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def main() -> None:
    import resource

    request = json.load(sys.stdin)
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(3000)
    out = sys.stdout
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (candidates may print; keep the JSON clean)
    mixed = request.get("already", 0)
    for index, source in enumerate(request["solutions"]):
        row = _screen_one(source, request)
        out.write(json.dumps({"index": index, **row}) + "\n")
        out.flush()
        values = list(row["outcomes"].values())
        if "timeout" not in values and 0 < sum(v != "passed" for v in values) < len(values):
            mixed += 1
        if request.get("stop_when") is not None and mixed >= request["stop_when"]:
            break


if __name__ == "__main__":
    main()
