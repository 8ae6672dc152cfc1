"""The exact_match pattern process: runs ``exact_match``'s ``pattern`` over the policy's text, with a
time limit, never in the controller.

Why a process: ``pattern`` is the user's regular expression and the text is the policy's. Python's
regular-expression engine holds the GIL while it matches, so a pattern that backtracks on what the
policy wrote (``'\\\\boxed\\{(.*)\\}'`` over 160 KB of ``\\boxed{``: 8 s) stalled the controller's
event loop even from a worker thread: every other rollout's scoring, the gateway bridge, heartbeats.
Here it costs this process's time limit instead. The engine checks for signals while it matches, so
a ``SIGALRM`` at the limit ends the match; the process then answers the next request.

Memory is bounded too: ``--memory-mb N`` caps the address space this process may add to what it
holds once started (``RLIMIT_AS``). A pattern's match keeps a backtracking stack that grows with the
text (``((a)|b)*$`` over 1 MB of ``a``: 175 MB; more groups, more per character), so without a cap
the policy's text chose how much of the controller's machine it took. Past the cap the engine raises
``MemoryError``: the answer's outcome is ``raised``, the memory is freed, and the process answers on.

Nothing here runs the policy's text as code (a regular expression only reads it), so this process is
not confined the way the reasoning-gym scorer's children are; it is started by ``ScorerProcess``
(isolated mode, a scrubbed environment, a private working folder).

Protocol (JSON lines, ``harnessrl.controller.evaluators.scorer_process``): a first line ``{"ready":
true, "pid": N}``; then each request ``{"id", "text", "pattern", "fallback", "golds": [str],
"normalize": bool, "timeout_s"}`` gets one reply ``{"id", "outcome", "extracted"?, "hit"?,
"error"?}``, where ``outcome`` is ``matched`` (``hit``: the extracted answer equals a gold;
``extracted`` at most ``EXTRACTED_LIMIT`` characters), ``timeout`` (the pattern ran past
``timeout_s``) or ``raised`` (matching raised, e.g. out of memory; a request too big to read within
the cap gets this reply too). End of input ends the process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import sys
from typing import Any

from harnessrl.tasks.answers import answers_match, extract_answer

MATCHED, TIMEOUT, RAISED = "matched", "timeout", "raised"
EXTRACTED_LIMIT = 4096  # characters of the extracted answer reported back (a reply line is bounded)
DEFAULT_TIMEOUT_S = 5.0  # a request without a usable timeout_s
DEFAULT_MEMORY_MB = 512  # address space this process may add to its own at start (--memory-mb)
# ``ScorerProcess`` writes the id last (``{**payload, "id": N}``): found there in a request too big
# to parse within the memory cap, so that request still gets its reply.
_TRAILING_ID = re.compile(rb'"id":\s*(\d{1,18})\}\s*$')


class _PastTimeLimit(Exception):
    """Raised by the ``SIGALRM`` handler inside the match that ran past its limit."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _PastTimeLimit


def _timeout(request: dict[str, Any]) -> float:
    value = request.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:  # NaN too
        return DEFAULT_TIMEOUT_S
    return min(float(value), 86_400.0)


def score(request: dict[str, Any]) -> dict[str, Any]:
    """Extract the answer from ``request["text"]`` with its pattern and compare it with its golds,
    within ``timeout_s`` (wall clock)."""
    golds = [str(g) for g in request.get("golds") or []]
    try:
        signal.setitimer(signal.ITIMER_REAL, _timeout(request))
        pattern = request.get("pattern")
        compiled = re.compile(pattern) if isinstance(pattern, str) else None
        answer = extract_answer(str(request.get("text", "")), compiled, request.get("fallback", "none"))
        normalize = request.get("normalize", True) is not False
        hit = answer is not None and any(answers_match(answer, g, normalize=normalize) for g in golds)
    except _PastTimeLimit:
        return {"outcome": TIMEOUT, "error": f"the pattern ran past its time limit ({_timeout(request):g}s)"}
    except Exception as exc:  # MemoryError included: the text's doing, this process lives on
        return {"outcome": RAISED, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    capped = answer if answer is None or len(answer) <= EXTRACTED_LIMIT else answer[:EXTRACTED_LIMIT]
    return {"outcome": MATCHED, "extracted": capped, "hit": hit}


def _reply(out: Any, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def cap_memory(memory_mb: int) -> None:
    """Let this process grow by at most ``memory_mb`` MiB of address space beyond what it holds now."""
    with open("/proc/self/statm", "rb") as statm:
        vsize = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vsize + (memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pattern_scorer")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    cap_memory(max(args.memory_mb, 16))
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    _reply(out, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            request_id = request["id"]
        except MemoryError:  # the text alone does not fit the cap: the policy's, answered as such
            found = _TRAILING_ID.search(line[-64:])
            if found is not None:
                _reply(
                    out, {"id": int(found[1]), "outcome": RAISED, "error": "MemoryError: reading the text"}
                )
            continue
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            print(f"pattern_scorer: bad request: {exc}", file=sys.stderr, flush=True)
            continue
        try:
            result = score(request)
        except _PastTimeLimit:  # the alarm landed as the match finished, before it was disarmed
            result = {"outcome": TIMEOUT, "error": "the pattern ran past its time limit"}
        _reply(out, {**result, "id": request_id})
    return 0


if __name__ == "__main__":
    sys.exit(main())
