"""Test-session settings shared by every test folder.

Built and converted models (the tiny model, SmolLM2 converted from its GGUF) go to the checkout's
own ``.cache/harnessrl`` instead of ``~/.cache``, so the suite behaves the same on a fresh machine
as on a developer's (the first run builds them; later runs reuse them). Subprocesses inherit it.

The suite runs on every core (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml). Tests
that share an expensive server are put in one ``xdist_group``, so one worker runs them all and the
server starts once: every real-vLLM test (``-m vllm``, and whatever uses the session's vLLM
servers) shares one vLLM server, the dashboard tests one trained run, the PostgreSQL tests one
throwaway server. Each worker runs its tests longest first, by the durations recorded in
``tests/durations.json`` (a group counts as the sum of its tests), so a long test or group does
not start last and leave the other cores idle; ``python tests/durations.py`` rewrites it from a
``--durations=0`` run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault(
    "HARNESSRL_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "harnessrl")
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Session fixtures that start a server or a run, and the group of the tests that use them.
SHARED_FIXTURES = {
    "tiny_server": "vllm",  # tests/vllm/conftest.py: the session's vLLM server
    "smollm2_server": "vllm",
    "tiny_run": "dashboard-run",  # tests/dashboard/conftest.py: a 2-step harnessrl train
    "pg_server": "postgres",  # tests/store/conftest.py: a throwaway PostgreSQL server
}
DURATIONS = Path(__file__).resolve().parent / "durations.json"


def group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker("vllm") is not None:
        return "vllm"  # one vLLM server at a time, however many workers
    for fixture, group in SHARED_FIXTURES.items():
        if fixture in getattr(item, "fixturenames", ()):
            return group
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return  # one process: keep the files' own order
    recorded: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    weight: dict[str, float] = {}
    for item in items:
        key = group_of(item) or item.nodeid
        weight[key] = weight.get(key, 0.0) + recorded.get(item.nodeid, 0.0)
    # Every worker collects the same items and sorts them alike: the scheduler hands out the
    # longest units first. sorted() is stable: equal weights keep the collection order.
    items.sort(key=lambda item: -weight[group_of(item) or item.nodeid])
