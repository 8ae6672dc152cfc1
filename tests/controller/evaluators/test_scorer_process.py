"""``ScorerProcess`` reading what a scorer process writes: a line it cannot use is noted and skipped,
and the replies after it still arrive.

The scorer process here is a small real program, run the way ``ScorerProcess`` runs every scorer
(``python -I -B -m MODULE ARGS``): ``cProfile -o /dev/null SCRIPT`` runs a script file as
``__main__`` without printing anything of its own, so no module has to be installed for the test."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from harnessrl.controller.evaluators.scorer_process import ScorerProcess

# Before each reply, the lines a broken (or subverted) scorer might write: one nested past the JSON
# parser's depth, one whose id is no request's and cannot be looked up.
NOISY_SCORER = r"""
import json, sys
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    # One write: the garbage and the reply reach the controller in the same read.
    sys.stdout.write("[" * 100000 + "\n" + json.dumps({"id": [request["id"]]}) + "\n"
                     + json.dumps({"id": request["id"], "echo": request["echo"]}) + "\n")
    sys.stdout.flush()
"""


def test_a_reply_after_unreadable_lines_still_arrives(tmp_path: Path):
    """``json.loads`` raised RecursionError (and a list id TypeError) in the event loop's reader
    callback, which dropped the reply behind it in the buffer: the request timed out and scoring
    failed as infrastructure."""
    script = tmp_path / "noisy_scorer.py"
    script.write_text(NOISY_SCORER)
    process = ScorerProcess("cProfile", ["-o", os.devnull, str(script)])

    async def exchange() -> list[dict]:
        try:
            return [await process.request({"echo": n}, timeout_s=20) for n in range(2)]
        finally:
            await process.aclose()

    replies = asyncio.run(exchange())
    assert [reply["echo"] for reply in replies] == [0, 1]
    assert process.starts == 1  # the process was never taken for dead
