"""A child process for the store's cross-process tests (run as a script, not collected by pytest).

    python store_worker.py claim URL WORKER_ID       claim until the queue is empty; print each id
    python store_worker.py calls URL ROLLOUT_ID N    add N calls (forever if N < 0); print each seq

Both print ``ready`` and wait for a line on stdin before starting, so the parent can release all
workers at once and make them contend. Every line is flushed as soon as the store call returned.
"""

from __future__ import annotations

import os
import sys

from harnessrl.schemas import Call
from harnessrl.store import open_store


def call_for(rollout_id: str, n: int, tag: str = "") -> Call:
    """A deterministic call (``tag`` names its writer), so the parent can check it bit for bit."""
    return Call(
        rollout_id=rollout_id,
        request={"messages": [{"role": "user", "content": f"{tag}{n}"}]},
        response={"role": "assistant", "content": f"answer {n}"},
        prompt_token_ids=list(range(n, n + 50)),
        response_token_ids=[n, n + 1, n + 2],
        response_logprobs=[-n / 7, -1 / 3, 0.0],
    )


def main(argv: list[str]) -> None:
    command, url, arg = argv[:3]
    store = open_store(url)
    print("ready", flush=True)
    sys.stdin.readline()
    if command == "claim":
        while claimed := store.claim_rollouts(arg, 1):
            for rollout in claimed:
                print(rollout.rollout_id, flush=True)
    elif command == "calls":
        count, n = int(argv[3]), 0
        while count < 0 or n < count:
            print(store.add_call(call_for(arg, n, tag=f"{os.getpid()}:")).seq, flush=True)
            n += 1
    else:
        raise SystemExit(f"unknown command {command!r}")
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
