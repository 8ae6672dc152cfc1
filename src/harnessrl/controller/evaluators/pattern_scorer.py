"""The exact_match pattern process: runs ``exact_match``'s ``pattern`` over the policy's text, with a
time limit, never in the controller.

Why a process: ``pattern`` is the user's regular expression and the text is the policy's. Python's
regular-expression engine holds the GIL while it matches, so a pattern that backtracks on what the
policy wrote (``'\\\\boxed\\{(.*)\\}'`` over 160 KB of ``\\boxed{``: 8 s) stalled the controller's
event loop even from a worker thread: every other rollout's scoring, the gateway bridge, heartbeats.
Here it costs this process's time limit instead. The engine checks for signals while it matches, so
a ``SIGALRM`` at the limit ends the match; the process then answers the next request.

Nothing here runs the policy's text as code (a regular expression only reads it), so this process is
not confined the way the reasoning-gym scorer's children are; it is started by ``ScorerProcess``
(isolated mode, a scrubbed environment, a private working folder).

Protocol (JSON lines, ``harnessrl.controller.evaluators.scorer_process``): a first line ``{"ready":
true, "pid": N}``; then each request ``{"id", "text", "pattern", "fallback", "golds": [str],
"normalize": bool, "timeout_s"}`` gets one reply ``{"id", "outcome", "extracted"?, "hit"?,
"error"?}``, where ``outcome`` is ``matched`` (``hit``: the extracted answer equals a gold;
``extracted`` at most ``EXTRACTED_LIMIT`` characters), ``timeout`` (the pattern ran past
``timeout_s``) or ``raised`` (matching raised, e.g. out of memory). End of input ends the process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from typing import Any

from harnessrl.tasks.answers import answers_match, extract_answer

MATCHED, TIMEOUT, RAISED = "matched", "timeout", "raised"
EXTRACTED_LIMIT = 4096  # characters of the extracted answer reported back (a reply line is bounded)
DEFAULT_TIMEOUT_S = 5.0  # a request without a usable timeout_s


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


def main() -> int:
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    _reply(out, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        try:
            request = json.loads(line)
            request_id = request["id"]
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
