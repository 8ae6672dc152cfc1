"""The child that calls the code under test for a coding task's probes (standard library only).

The coding scorer (``probes.run_probes``) sends this file's source to ``python -I -c`` inside the
scored code's own domain (``run_scored``), with a request on stdin::

    {"module": "solution", "entry_point": "f", "helpers": "...", "prelude": "...", "uses_random": true,
     "timeout_s": 10, "max_repr": 16384,
     "probes": [{"name": "test_check_00", "source": "def __probe__():\\n    ..."}]}

It reads the whole request *before* importing the function under test from the workspace's module
(that name alone, as the test module does: the prompt's helpers come from the request), points its
own stdout and stderr at ``/dev/null`` (the code under test may print) and writes one JSON line per
probe on a copy of the original stdout: ``{"name", "status": "returns" | "raises" | "timeout" |
"unrepresentable" | "too_large" | "not_run", "value": repr or exception name}``.

Nothing here is trusted by the scorer: the code under test runs in this process and may rewrite any
of it. The scorer compares each ``value`` (parsed with ``ast.literal_eval``) with an expected value
this process never sees, so the only way to a matching line is the right value.
"""

import ast
import json
import os
import random
import signal
import sys

_MEMORY_LIMIT = 2 << 30  # bytes of address space: a call that allocates without end fails


class _Timeout(BaseException):  # not an Exception: `except Exception` in the code under test can't swallow it
    pass


def _on_alarm(signum, frame):
    raise _Timeout


def _timed(fn, timeout_s):
    signal.setitimer(signal.ITIMER_REAL, timeout_s, timeout_s)  # re-arms: a swallowed tick fires again
    try:
        return "ok", fn()
    except _Timeout:
        return "timeout", None
    except BaseException as exc:  # noqa: BLE001 (SystemExit from the code under test is a failure too)
        return "raises", type(exc).__name__
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _describe(value, max_repr):
    """``repr(value)`` when it reads back as a literal (what the scorer can compare), else a status."""
    text = repr(value)
    if len(text) > max_repr:
        return "too_large", ""
    try:
        ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return "unrepresentable", type(value).__name__
    return "returns", text


def _probe(source, namespace, request, timeout_s, max_repr):
    """Define ``__probe__`` in a copy of the test module's namespace, call it, describe its value."""
    scope = dict(namespace)
    state, error = _timed(lambda: exec(compile(source, "probe.py", "exec"), scope), timeout_s)
    if state != "ok":
        return state, error
    if request.get("uses_random"):
        random.seed(0)  # as the test module's autouse fixture does under pytest
    state, value = _timed(scope["__probe__"], timeout_s)
    if state != "ok":
        return state, value
    state, described = _timed(lambda: _describe(value, max_repr), timeout_s)
    return described if state == "ok" else (state, described)


def main():
    request = json.loads(sys.stdin.buffer.read())
    out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_LIMIT, _MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    signal.signal(signal.SIGALRM, _on_alarm)
    sys.setrecursionlimit(3000)
    sys.path.insert(0, os.getcwd())  # -I leaves the working folder off sys.path
    timeout_s = float(request["timeout_s"])
    max_repr = int(request["max_repr"])
    namespace = {"__name__": "test_solution"}
    header = "\n".join(
        [
            "import random",
            request["prelude"],
            request["helpers"],
            f"from {request['module']} import {request['entry_point']}",
        ]
    )
    status, error = _timed(lambda: exec(compile(header, "test_solution.py", "exec"), namespace), timeout_s)
    for probe in request["probes"]:
        if status == "ok":
            state, value = _probe(probe["source"], namespace, request, timeout_s, max_repr)
        else:
            state, value = "not_run", error or ""
        row = {"name": probe["name"], "status": state, "value": value or ""}
        os.write(out, (json.dumps(row) + "\n").encode())


if __name__ == "__main__":
    main()
