"""The reasoning-gym scorer process: scores policy answers with the dataset's own ``score_answer``,
each in a confined child of its own, never in the controller.

Why a process: several reasoning-gym scorers evaluate the answer as Python (``eval(answer)``,
``sympy.parse_expr(answer)``), so an answer scored in the controller runs with the controller's
privileges: it can write files, open connections, patch the evaluator for every later reward, or
hold the GIL for seconds. Here the answer meets the scorer only in a child that

1. is forked from this process (which imported reasoning-gym once: the import takes about a second,
   and a run scores thousands of answers) after it regenerated the task's entry itself, from the
   task data alone (``harnessrl.tasks.reasoning_gym.scoring_entry``; the datasets stay cached here);
2. confines itself before it reads the answer (``harnessrl.sandbox.forked``: one result pipe and no
   other descriptor, no privileges, a Landlock domain that reads only libraries and writes nothing,
   no network, no signals, no processes, seccomp, CPU and memory limits);
3. refuses to compile any code the answer wrote (``harnessrl.sandbox.code_guard``): the child's
   verdict pipe is in its own process, so code from the answer could otherwise write the verdict;
4. extracts the answer (``harnessrl.tasks.answers.extract_answer``: a pattern that backtracks on
   what the policy wrote costs the child's time, not the controller's), scores it, writes its
   result and exits.

This process kills a child past its deadline (SIGKILL) and reports, per request, what happened. One
child per score: nothing an answer does outlives it. Requests are started one at a time, in order,
with the children's exits and deadlines handled between two (``Zygote``); an answer's clock starts
when its child is forked, after its entry was regenerated.

Protocol (JSON lines): the controller (``harnessrl.controller.evaluators.scorer_process``) starts
``python -I -B -m harnessrl.tasks.reasoning_gym_scorer --isolation required|available`` and reads a
first line ``{"ready": true, "isolation": "full"|"no landlock, ...", "pid": N}`` (or ``{"ready":
false, "error": ...}``). Then each request ``{"id", "task", "text", "pattern": regex|null,
"fallback", "raw": bool, "timeout_s", "memory_mb"}`` (``text``: the rollout's final answer or
stdout, ``<think>`` blocks removed; ``timeout_s`` at most ``MAX_TIMEOUT_S``, longer is clamped) gets
one reply ``{"id", "outcome", "score"?, "extracted"?, "error"?, "out_of_range"?, "isolation",
"seconds"}``, where ``outcome`` is

- ``scored`` (``score`` in [0, 1]) or ``no_answer`` (nothing to extract): the answer's score;
- ``raised`` (the scorer raised on this answer), ``timeout`` (past ``timeout_s`` or its CPU limit),
  ``failed`` (died or gave no valid result; ``out_of_range: true`` when the result was a score
  outside [0, 1], which is never clamped): the answer's doing, reward 0 with a flag;
- ``task_error`` (the entry could not be regenerated), ``isolation_error`` (no child could be
  started or confined; the answer was not read): infrastructure failures.

``raw`` requests score ``text`` as the answer itself, unextracted. End of input ends the process.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import re
import selectors
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

SCORED, NO_ANSWER, RAISED, TIMEOUT, FAILED = "scored", "no_answer", "raised", "timeout", "failed"
TASK_ERROR, ISOLATION_ERROR = "task_error", "isolation_error"
EXTRACTED_LIMIT = 4096  # characters of the extracted answer reported back
_OUTPUT_LIMIT = 1 << 16  # bytes a child may write; more is not a valid result
_PR_SET_DUMPABLE = 4
DEFAULT_TIMEOUT_S = 30.0  # a request without a usable timeout_s
MAX_TIMEOUT_S = 86_400.0  # longer is clamped (the evaluator's config refuses it)
# The longest one wait in select: far-off deadlines are looked at again after this (a timeout past
# ~24 days would overflow epoll's milliseconds and end the process).
_MAX_WAIT_S = 60.0


@dataclass
class _Child:
    request_id: Any
    pid: int
    pidfd: int
    pipe: int
    started: float
    deadline: float
    output: bytearray = field(default_factory=bytearray)
    pipe_open: bool = True
    killed: bool = False  # by us, at the deadline (it may have exited just before: see _outcome)
    cpu_seconds: float = 0.0


class Zygote:
    """Reads requests from ``requests`` (a descriptor), forks one confined child per request and
    writes each reply to ``replies``. ``confinement`` is what every child enters.

    Requests are queued as they are read and started one per turn of the loop: regenerating an entry
    can take a second (``knight_swap``), and between two of them the loop answers children that
    exited and kills those past their deadline. A child that exited before we got to its deadline is
    judged by its result, never reported as a timeout."""

    def __init__(self, requests: int, replies: int, confinement: Any):
        self.requests, self.replies = requests, replies
        self.confinement = confinement
        self.children: dict[int, _Child] = {}  # by pid
        self.queue: deque[bytes] = deque()  # request lines read, not started yet
        self.selector = selectors.DefaultSelector()
        self.buffer = bytearray()

    def serve(self) -> None:
        self.selector.register(self.requests, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in self.selector.select(self._wait_s()):
                    if key.data is None:
                        if not self._read_requests():
                            return
                    else:
                        kind, child = key.data
                        self._child_event(kind, child)
                self._enforce_deadlines()
                if self.queue:
                    self._request(self.queue.popleft())
        finally:
            for child in list(self.children.values()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, 0)

    def _wait_s(self) -> float | None:
        """How long select may wait: not at all while requests are queued, else until the next
        deadline (at most ``_MAX_WAIT_S``), or for ever when nothing runs."""
        if self.queue:
            return 0.0
        deadlines = [c.deadline for c in self.children.values() if not c.killed]
        if not deadlines:
            return None
        return min(_MAX_WAIT_S, max(0.0, min(deadlines) - time.monotonic()))

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.killed or now < child.deadline:
                continue
            # While we regenerated entries it may have exited with its verdict, its exit not yet
            # read: answer it by that verdict instead of killing a finished child.
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                self._finish(child, status, usage)
                continue
            child.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)

    def _read_requests(self) -> bool:
        chunk = os.read(self.requests, 1 << 20)
        if not chunk:
            return False  # the controller closed our input (or is gone): stop
        start = len(self.buffer)
        self.buffer += chunk
        while (end := self.buffer.find(b"\n", start)) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            start = 0
            if line.strip():
                self.queue.append(line)
        return True

    def _request(self, line: bytes) -> None:
        try:
            request = json.loads(line)
            request_id = request["id"]
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            print(f"reasoning_gym_scorer: bad request: {exc}", file=sys.stderr, flush=True)
            return
        from harnessrl.tasks.reasoning_gym import scoring_entry

        try:  # trusted work, on the task alone: before any answer is touched
            dataset, entry = scoring_entry(request["task"])
        except Exception as exc:
            self._reply({"id": request_id, "outcome": TASK_ERROR, "error": _describe(exc)})
            return
        read, write = os.pipe()
        started = time.monotonic()  # the answer's clock starts here, after its entry was regenerated
        try:
            pid = os.fork()
        except OSError as exc:  # out of memory or processes: the machine's state, not the answer's
            os.close(read)
            os.close(write)
            self._reply({"id": request_id, "outcome": ISOLATION_ERROR, "error": f"fork: {exc}"})
            return
        if pid == 0:  # the child: never returns
            os.close(read)
            _score_in_child(write, dataset, entry, request, self.confinement)
        os.close(write)
        os.set_blocking(read, False)
        child = _Child(request_id, pid, os.pidfd_open(pid), read, started, started + _timeout(request))
        self.children[pid] = child
        self.selector.register(child.pipe, selectors.EVENT_READ, ("pipe", child))
        self.selector.register(child.pidfd, selectors.EVENT_READ, ("exit", child))

    def _child_event(self, kind: str, child: _Child) -> None:
        if self.children.get(child.pid) is not child:
            return  # both of its events came in one batch: already answered
        if kind == "pipe":
            self._drain(child)
            return
        _, status, usage = os.wait4(child.pid, 0)
        self._finish(child, status, usage)

    def _finish(self, child: _Child, status: int, usage: Any) -> None:
        """``child`` exited (and was reaped, with ``status`` and ``usage``): answer its request."""
        child.cpu_seconds = usage.ru_utime + usage.ru_stime
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        # It is dead, so all it wrote is in the pipe. Read that and close it, even if something it
        # started still held the other end (it cannot start anything: that would be a way to hang us).
        self._drain(child)
        if child.pipe_open:
            self._close_pipe(child)
        del self.children[child.pid]
        self._reply(self._outcome(child, status))

    def _drain(self, child: _Child) -> None:
        while child.pipe_open:
            try:
                data = os.read(child.pipe, 1 << 16)
            except BlockingIOError:
                return
            if not data:
                self._close_pipe(child)
                return
            if len(child.output) <= _OUTPUT_LIMIT:
                child.output += data[: _OUTPUT_LIMIT + 1 - len(child.output)]

    def _close_pipe(self, child: _Child) -> None:
        child.pipe_open = False
        self.selector.unregister(child.pipe)
        os.close(child.pipe)

    def _outcome(self, child: _Child, status: int) -> dict[str, Any]:
        reply: dict[str, Any] = {
            "id": child.request_id,
            "isolation": self.confinement.level,
            "seconds": round(time.monotonic() - child.started, 4),
        }
        result = _parse_result(child.output)
        if "extracted" in result:
            reply["extracted"] = result["extracted"]
        signalled = os.WIFSIGNALED(status) and os.WTERMSIG(status)
        out_of_cpu = signalled == signal.SIGXCPU or (
            signalled == signal.SIGKILL and child.cpu_seconds >= math.ceil(child.deadline - child.started) + 1
        )
        # Killed by us only if our SIGKILL ended it: one that exited by itself just before the kill
        # landed finished in time, and is judged by its result below.
        killed = child.killed and signalled == signal.SIGKILL
        if killed or out_of_cpu:
            why = "its time limit" if killed else "its CPU limit"
            return {**reply, "outcome": TIMEOUT, "error": f"the scorer was killed at {why}"}
        if "confinement_error" in result:
            return {**reply, "outcome": ISOLATION_ERROR, "error": str(result["confinement_error"])}
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            how = f"signal {signalled}" if signalled else f"exit status {os.WEXITSTATUS(status)}"
            return {**reply, "outcome": FAILED, "error": f"the scorer died ({how})"}
        score = result.get("score")
        if isinstance(score, int | float) and not isinstance(score, bool):
            if 0.0 <= score <= 1.0:
                return {**reply, "outcome": NO_ANSWER if result.get("no_answer") else SCORED, "score": score}
            # Not clamped, not even 1.0000000000000002: spell_backward gives that to the gold with junk
            # after it, and clamping would pay the junk. The answer's doing: reward 0, with its flag.
            return {
                **reply,
                "outcome": FAILED,
                "out_of_range": True,
                "error": f"the scorer's score {score!r} is outside [0, 1]",
            }
        if "raised" in result:
            return {**reply, "outcome": RAISED, "error": str(result["raised"])[:500]}
        return {**reply, "outcome": FAILED, "error": "the scorer gave no valid result"}

    def _reply(self, reply: dict[str, Any]) -> None:
        _write_all(self.replies, json.dumps(reply).encode() + b"\n")


def _timeout(request: dict[str, Any]) -> float:
    """The request's ``timeout_s``: positive and at most ``MAX_TIMEOUT_S`` (inf included), else the
    default."""
    value = request.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:  # NaN too
        return DEFAULT_TIMEOUT_S
    return min(float(value), MAX_TIMEOUT_S)


def _parse_result(output: bytes) -> dict[str, Any]:
    """The child's lines (each a JSON object) merged; anything unreadable makes it no result."""
    result: dict[str, Any] = {}
    if len(output) > _OUTPUT_LIMIT:
        return result
    for line in output.splitlines():
        try:
            part = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            return {}
        if not isinstance(part, dict):
            return {}
        result.update(part)
    return result


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _trusted_strings(value: Any, found: set[str] | None = None) -> set[str]:
    """Every string in an entry (its expressions, which some scorers ``eval``)."""
    found = set() if found is None else found
    if isinstance(value, str):
        found.add(value)
    elif isinstance(value, dict):
        for item in value.values():
            _trusted_strings(item, found)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _trusted_strings(item, found)
    return found


def _score_in_child(write: int, dataset: Any, entry: dict[str, Any], request: dict, confinement: Any) -> None:
    """The child: confine, then extract and score the answer; report on ``write``; ``_exit``."""
    try:
        try:
            trusted = _trusted_strings(entry)
            timeout = _timeout(request)
            memory_mb = request.get("memory_mb", 512)
            fd = confinement.enter(
                write,
                cpu_seconds=math.ceil(timeout) + 1,
                memory_bytes=int(memory_mb if isinstance(memory_mb, int) else 512) << 20,
            )
        except BaseException as exc:
            report = json.dumps({"confinement_error": _describe(exc)}).encode() + b"\n"
            for target in (write, 3):  # 3: where enter() had moved it before the step that failed
                with contextlib.suppress(OSError):
                    _write_all(target, report)
                    break
            os._exit(0)
        from harnessrl.sandbox.code_guard import forbid_untrusted_code

        forbid_untrusted_code(trusted)
        # -- untrusted from here: the answer is read -------------------------------------------------
        try:
            answer = _extract(request)
            _write_all(fd, json.dumps({"extracted": _cap(answer)}).encode() + b"\n")
            if answer is None:
                verdict: dict[str, Any] = {"score": 0.0, "no_answer": True}
            else:
                verdict = {"score": float(dataset.score_answer(answer, entry))}
        except BaseException as exc:  # the answer made the scorer raise (MemoryError included)
            verdict = {"raised": _describe(exc)}
        _write_all(fd, json.dumps(verdict).encode() + b"\n")
    finally:
        os._exit(0)


def _extract(request: dict[str, Any]) -> str | None:
    from harnessrl.tasks.answers import extract_answer

    text = request.get("text")
    if not isinstance(text, str):
        return None
    if request.get("raw"):
        return text
    pattern = request.get("pattern")
    return extract_answer(text, re.compile(pattern) if pattern else None, request.get("fallback", "none"))


def _cap(answer: str | None) -> str | None:
    return answer if answer is None or len(answer) <= EXTRACTED_LIMIT else answer[:EXTRACTED_LIMIT]


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)):
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _warm_up() -> None:
    """Import and exercise what children use, so that no child compiles or imports it again."""
    import reasoning_gym  # noqa: F401  (registers every dataset)
    from sympy.parsing.sympy_parser import parse_expr

    import harnessrl.sandbox.code_guard  # noqa: F401
    import harnessrl.tasks.answers  # noqa: F401
    import harnessrl.tasks.reasoning_gym  # noqa: F401

    parse_expr("x**2 + 1/3")  # its first call imports more of sympy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harnessrl.tasks.reasoning_gym_scorer")
    parser.add_argument("--isolation", choices=("required", "available"), default="required")
    args = parser.parse_args(argv)
    # Our replies go to the original stdout only: anything a library prints goes to stderr.
    requests, replies = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us ends (the controller may
    # start us from a worker thread). We end on end of input, which the controller's exit gives too.
    try:
        _prctl(_PR_SET_DUMPABLE, 0)  # no /proc/<pid>/mem, environ, fd for same-uid processes
        os.close(os.pidfd_open(os.getpid()))  # Linux >= 5.3: how children are watched
        _warm_up()
        from harnessrl.sandbox import forked

        confinement = forked.prepare()
        if confinement.missing and args.isolation == "required":
            raise RuntimeError(
                f"cannot confine the scored answers here ({confinement.level}); "
                "evaluator.isolation = 'available' scores without what is missing"
            )
    except Exception as exc:
        _write_all(replies, json.dumps({"ready": False, "error": _describe(exc)}).encode() + b"\n")
        return 1
    gc.freeze()  # what is here now is shared with every child: keep the collector off those pages
    ready = {"ready": True, "isolation": confinement.level, "pid": os.getpid()}
    _write_all(replies, json.dumps(ready).encode() + b"\n")
    Zygote(requests, replies, confinement).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
