"""The reasoning-gym scorer process (``harnessrl.tasks.reasoning_gym_scorer``) and what it relies on: it
scores as the datasets' own scorers do, refuses code from answers (``sandbox.code_guard``), refuses
puzzle24, and its process is restarted, replaced or ended as ``ScorerProcess`` promises."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym

from harnessrl.controller.evaluators import (
    EvaluationInput,
    EvaluatorError,
    ReasoningGymEvaluator,
    build_evaluator,
    parse_evaluator_config,
)
from harnessrl.controller.evaluators.scorer_process import ScorerProcess, ScorerUnavailable
from harnessrl.errors import ConfigError
from harnessrl.sandbox import landlock
from harnessrl.sandbox.code_guard import is_plain_expression
from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks, score_answer

needs_landlock = pytest.mark.skipif(
    landlock.abi_version() < 1, reason="the scorer process refuses to start without Landlock"
)
MODULE = "harnessrl.tasks.reasoning_gym_scorer"


def request(process: ScorerProcess, task: dict[str, Any], answer: str, **extra: Any) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        return await process.request({"task": task, "text": answer, "raw": True, **extra}, timeout_s=60)

    return asyncio.run(run())


@pytest.fixture(scope="module")
def scorer() -> Any:
    process = ScorerProcess(MODULE)
    yield process
    asyncio.run(process.aclose())


# -- the datasets' own scores ------------------------------------------------------------------------

# Every dataset whose scorer evaluates the answer (eval, sympy.parse_expr), two that eval their own
# entry's expression, and a few plain ones. A sweep of all 105 datasets (3 entries each, the gold
# answer and "0") found no difference either.
DATASETS = [
    "string_insertion",
    "spiral_matrix",
    "binary_matrix",
    "n_queens",
    "countdown",
    "polynomial_multiplication",
    "simple_integration",
    "intermediate_integration",
    "bitwise_arithmetic",
    "number_sorting",
    "basic_arithmetic",
    "chain_sum",
    "prime_factorization",
    "complex_arithmetic",
]


def in_process(task: dict[str, Any], answer: str) -> tuple[str, Any]:
    try:
        return "scored", score_answer(task, answer)
    except Exception as exc:
        return "raised", type(exc).__name__


@needs_landlock
@pytest.mark.parametrize("dataset", DATASETS)
def test_scores_are_the_datasets_own(scorer, dataset):
    for task in (t.data for t in reasoning_gym_tasks(dataset, size=2, seed=1)):
        gold = str(task["hidden"]["answer"])
        answers = [gold, "0", " ".join(gold.split()[:1]) or "x"]
        if dataset in ("string_insertion", "spiral_matrix", "binary_matrix"):
            answers.append(repr(list(gold)))  # the scorers' list-literal path (partial credit)
        for answer in answers:
            reply = request(scorer, task, answer)
            got = (reply["outcome"], reply.get("score") if reply["outcome"] == "scored" else None)
            want = in_process(task, answer)
            assert got == (want if want[0] == "scored" else ("raised", None)), (answer, reply)
    assert scorer.ready_info["isolation"] == "full"


@needs_landlock
def test_a_list_literal_still_earns_its_partial_credit(scorer):
    task = reasoning_gym_tasks("string_insertion", size=1, seed=0)[0].data
    reply = request(scorer, task, repr(list(task["hidden"]["answer"])))
    assert reply["outcome"] == "scored" and reply["score"] == pytest.approx(0.1)


# -- puzzle24 ------------------------------------------------------------------------------------------


def test_puzzle24_is_refused_as_tasks_and_by_the_evaluator(tmp_path):
    # Why: its scorer gives full marks to any expression of four allowed numbers that makes 24.
    dataset = reasoning_gym.create_dataset("puzzle24", seed=0, size=3)
    assert all(dataset.score_answer("9+9+5+1", dataset[i]) == 1.0 for i in range(3))
    with pytest.raises(ConfigError, match=r"puzzle24.*numbers"):
        reasoning_gym_tasks("puzzle24", size=1, seed=0)
    with pytest.raises(ConfigError, match=r"evaluator\.dataset: .*puzzle24.*numbers"):
        build_evaluator({"type": "reasoning_gym", "dataset": "puzzle24"})


@needs_landlock
def test_a_puzzle24_task_is_not_scored(scorer):
    task = {"dataset": "puzzle24", "question": "q", "hidden": {"answer": "9+9+5+1", "metadata": {}}}
    reply = request(scorer, task, "9+9+5+1")
    assert reply["outcome"] == "task_error" and "puzzle24" in reply["error"]


# -- no code from answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "plain"),
    [
        ("[1, 'a', (2.5, -3)]", True),
        ("7**(2*7**8)", True),
        ("Symbol('x')**Integer(2) + sin(Symbol('x'))", True),
        ("Function('f')(Symbol('x'))", True),
        ("Add(x, Integer(1), evaluate=False)", True),
        ("pi*E + I", True),
        ("__import__('os')", False),
        ("entry['answer']", False),
        ("oracle_answer", False),
        ("(1).__class__", False),
        ("open('/etc/passwd')", False),
        ("var('z')", False),
        ("lambda: 1", False),
        ("[c for c in 'ab']", False),
        ("f'{x}'", False),
        ("Symbol(**{'name': 'x'})", False),
        ("Function('f', cls=1)(x)", False),
    ],
)
def test_plain_expressions(source, plain):
    assert is_plain_expression(ast.parse(source, mode="eval")) is plain


GUARDED = r"""
import json, sys
from sympy.parsing.sympy_parser import parse_expr
from harnessrl.sandbox.code_guard import forbid_untrusted_code

parse_expr("x")
forbid_untrusted_code(trusted={"0x3a + 0x1f"})
oracle_answer = "gold"

def attempt(fn):
    try:
        return repr(fn())
    except Exception as exc:
        return type(exc).__name__

print(json.dumps({
    "code": attempt(lambda: eval("__import__('os').getpid()")),
    "leak": attempt(lambda: eval("oracle_answer")),
    "trusted": attempt(lambda: eval("0x3a + 0x1f")),
    "literal": attempt(lambda: eval("['a', 'b']")),
    "sympy": attempt(lambda: str(parse_expr("x**2 + sin(x)/3"))),
    "sympy_code": attempt(lambda: parse_expr("__import__('os').system('true')")),
    "exec": attempt(lambda: exec("import os")),
    "write": attempt(lambda: open(sys.argv[1], "w")),
    "pickle": attempt(lambda: __import__("pickle").loads(b"cos\nsystem\n(S'true'\ntR.")),
}))
"""


def test_the_guard_refuses_code_and_lets_expressions_through(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", GUARDED, str(tmp_path / "w")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    refused = {k for k, v in got.items() if v == "UntrustedCodeError"}
    assert refused == {"code", "leak", "sympy_code", "exec", "write", "pickle"}, got
    assert (got["trusted"], got["literal"], got["sympy"]) == ("89", "['a', 'b']", "'x**2 + sin(x)/3'")
    assert not (tmp_path / "w").exists()


def test_without_the_guard_the_same_calls_run(tmp_path):
    """Control: the probes above see success when nothing refuses them."""
    unguarded = GUARDED.replace('forbid_untrusted_code(trusted={"0x3a + 0x1f"})', "")
    done = subprocess.run(
        [sys.executable, "-c", unguarded, str(tmp_path / "w")], capture_output=True, text=True, timeout=120
    )
    got = json.loads(done.stdout)
    assert got["code"] == str(int(got["code"])) and got["leak"] == "'gold'" and (tmp_path / "w").exists()


# -- the process ---------------------------------------------------------------------------------------


@needs_landlock
def test_the_scorer_process_gets_none_of_the_controllers_environment(monkeypatch):
    monkeypatch.setenv("HARNESSRL_ADMIN_KEY", "admin-secret-3b1f")
    process = ScorerProcess(MODULE)
    task = reasoning_gym_tasks("basic_arithmetic", size=1, seed=0)[0].data

    async def run() -> tuple[bytes, str]:
        await process.request({"task": task, "text": "1", "raw": True}, timeout_s=60)
        pid = process.pid
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
        await process.aclose()
        return environ, cwd

    environ, cwd = asyncio.run(run())
    assert b"admin-secret-3b1f" not in environ and b"PYTHONPATH" not in environ
    assert cwd.startswith("/tmp/harnessrl-scorer-") or "harnessrl-scorer-" in cwd
    assert not Path(cwd).exists()  # removed with the process


@needs_landlock
def test_a_killed_scorer_process_is_replaced_and_an_ended_one_is_gone():
    evaluator = build_evaluator({"type": "reasoning_gym", "source": "stdout"})
    task = reasoning_gym_tasks("basic_arithmetic", size=1, seed=0)[0].data
    inp = EvaluationInput(task=task, workspace=Path("/tmp"), stdout=f"Answer: {task['hidden']['answer']}")

    async def run() -> tuple[float, float, int, int | None]:
        first = await evaluator.evaluate(inp)
        pid = evaluator.scorer.pid
        os.kill(pid, signal.SIGKILL)  # e.g. the kernel's OOM killer
        second = await evaluator.evaluate(inp)
        new_pid = evaluator.scorer.pid
        await evaluator.aclose()
        return first.reward, second.reward, pid, new_pid

    first, second, pid, new_pid = asyncio.run(run())
    assert (first, second) == (1.0, 1.0)
    assert new_pid not in (None, pid) and evaluator.scorer.starts == 2
    assert not Path(f"/proc/{new_pid}").exists()  # ended, and reaped


@needs_landlock
def test_a_stuck_scorer_process_is_an_infrastructure_failure_and_is_replaced():
    process = ScorerProcess(MODULE)
    task = reasoning_gym_tasks("basic_arithmetic", size=1, seed=0)[0].data

    async def run() -> tuple[str, dict[str, Any]]:
        await process.request({"task": task, "text": "1", "raw": True}, timeout_s=60)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            await process.request({"task": task, "text": "1", "raw": True}, timeout_s=1)
            stuck = "replied"
        except ScorerUnavailable as exc:
            stuck = str(exc)
        reply = await process.request(
            {"task": task, "text": task["hidden"]["answer"], "raw": True}, timeout_s=60
        )
        await process.aclose()
        return stuck, reply

    stuck, reply = asyncio.run(run())
    assert "did not reply within 1s" in stuck
    assert reply["outcome"] == "scored" and reply["score"] == 1.0 and process.starts == 2


def test_a_scorer_process_that_cannot_start_is_an_infrastructure_failure():
    process = ScorerProcess("harnessrl.no_such_scorer_module")
    with pytest.raises(ScorerUnavailable, match="No module named"):
        asyncio.run(process.request({"text": "1"}, timeout_s=10))


@needs_landlock
def test_an_evaluator_reports_a_process_that_cannot_start_as_an_evaluator_error():
    config = parse_evaluator_config({"type": "reasoning_gym"})
    evaluator = ReasoningGymEvaluator(config, scorer=ScorerProcess("harnessrl.no_such_scorer_module"))
    task = reasoning_gym_tasks("basic_arithmetic", size=1, seed=0)[0].data
    with pytest.raises(EvaluatorError, match="did not start"):
        asyncio.run(
            evaluator.evaluate(EvaluationInput(task=task, workspace=Path("/tmp"), stdout="Answer: 1"))
        )
