"""Test-session settings shared by every test folder.

Built and converted models (the tiny model, SmolLM2 converted from its GGUF) go to the checkout's
own ``.cache/harnessrl`` instead of ``~/.cache``, so the suite behaves the same on a fresh machine
as on a developer's (the first run builds them; later runs reuse them). Subprocesses inherit it.

The suite runs on every core (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml). Tests
that share an expensive server form one group (``GROUPS``: by file or folder), which one worker runs
whole, so the server starts once: every real-vLLM test shares one vLLM server (a ``-m vllm`` test
outside a "vllm" path is refused at collection, so none escapes), the dashboard tests one trained
run. The groups are applied by a scheduler of our own (``GroupScheduling``): pytest-xdist 3.8 marks
``xdist_group`` by rewriting ``item._nodeid``, which pytest 9 no longer reads, so its ``loadgroup``
groups nothing. Each worker gets the longest tests and groups first, by the durations recorded in
``tests/durations.json`` (a group counts as the sum of its tests), so a long one does not start
last and leave the other cores idle; ``python tests/durations.py LOG`` rewrites the record.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault(
    "HARNESSRL_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".cache" / "harnessrl")
)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Test files or folders (node id prefixes) whose tests one worker runs together, and why.
GROUPS = {
    "tests/vllm/": "vllm",  # the session's vLLM server (tests/vllm/conftest.py)
    "tests/cli/test_engine_serve.py": "vllm",  # starts vLLM servers: never two vLLM at once
    "tests/dashboard/": "dashboard",  # one 2-step harnessrl train (tests/dashboard/conftest.py)
}
DURATIONS = Path(__file__).resolve().parent / "durations.json"


def group_of(nodeid: str) -> str | None:
    for prefix, group in GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``HARNESSRL_TEST_LOG=FILE``, one line per test phase as it ends (seconds, phase,
    outcome, test id), written by the controlling process: a record of a run even if it is killed
    before pytest's own ``--durations`` summary (``python tests/durations.py FILE`` reads it)."""
    path = os.environ.get("HARNESSRL_TEST_LOG")
    if path and os.environ.get("PYTEST_XDIST_WORKER") is None:
        with open(path, "a") as log:
            log.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = [i.nodeid for i in items if i.get_closest_marker("vllm") and group_of(i.nodeid) != "vllm"]
    if stray:
        raise pytest.UsageError(
            f"tests marked vllm outside a 'vllm' group of tests/conftest.py GROUPS: {stray}"
        )
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return  # one process: keep the files' own order
    recorded: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    weight: dict[str, float] = {}
    for item in items:
        key = group_of(item.nodeid) or item.nodeid
        weight[key] = weight.get(key, 0.0) + recorded.get(item.nodeid, 0.0)
    # Every worker collects the same items and sorts them alike; the scheduler hands out units in
    # this order. sorted() is stable: equal weights keep the collection order.
    items.sort(key=lambda item: -weight[group_of(item.nodeid) or item.nodeid])


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """``loadgroup`` by ``GROUPS``: a group's tests are one unit, every other test its own."""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


#: Held shared (``flock``) by each test session's controlling process for its whole life, so the
#: last session to end knows it is the last: see ``pytest_sessionfinish``.
_SESSION_LOCK: Any = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _SESSION_LOCK
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    cache = Path(os.environ["HARNESSRL_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    _SESSION_LOCK = open(cache / "pytest-sessions.lock", "a")  # noqa: SIM115 - held for the session
    fcntl.flock(_SESSION_LOCK, fcntl.LOCK_SH)


def other_session_running() -> bool:
    """Whether another test session on this checkout's cache is still running: our shared lock
    cannot become exclusive while another session holds its own."""
    try:
        fcntl.flock(_SESSION_LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Unmount the images the tests mounted (the sandbox's roots stay mounted for reuse while a run
    goes on), once every worker is done: the controlling process only, or a run without workers. A
    checkout left with mounts inside cannot be deleted. Not while another test session on the same
    cache runs (a second pytest beside the first): its image tests would lose their mounts midway;
    the last session to end unmounts for both."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        return
    if _SESSION_LOCK is not None and other_session_running():
        return
    from harnessrl.environments.podman import Podman, podman_problem
    from harnessrl.environments.store import default_store

    store = default_store()
    if store.is_dir() and podman_problem() is None:
        Podman(store).run("image", "unmount", "--all", "--force", check=False)
