"""The reasoning-gym scorer process (``harnessrl.tasks.reasoning_gym_scorer``) and what it relies on: it
scores as the datasets' own scorers do, refuses code from answers (``sandbox.code_guard``), refuses
the datasets that pay for shortcuts, and its process is restarted, replaced or ended as ``ScorerProcess`` promises."""

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
    "polynomial_multiplication",  # countdown parses with sympy too, but is refused
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


# -- refused datasets ------------------------------------------------------------------------------

# 128 + 32 + 4 with no digit in it: the regex that counts the numbers used sees only the comment's.
DIGIT_FREE_164 = "+".join(f"(True+True)**({'+'.join(['True'] * k)})" for k in (7, 5, 2))
# Each with a shortcut its own scorer pays 1.0 for (on one of the first entries at seed 0), and a word
# of the reason the refusal gives. tests/tasks/test_reasoning_gym_cheats.py sweeps the others.
REFUSED = [
    ("puzzle24", "9+9+5+1", "numbers"),
    ("countdown", "66 + 98 # 34 54 6", "comment"),  # 164 from 66, 34, 98, 54, 6
    ("countdown", f"{DIGIT_FREE_164} # 66 34 98 54 6", "digit-free"),
    ("coin_flip", "0", "prefix"),
    ("game_of_life_halting", "banana", "bool"),
]


@pytest.mark.parametrize(("dataset", "shortcut", "reason"), REFUSED)
def test_datasets_that_pay_for_a_shortcut_are_refused_as_tasks_and_by_the_evaluator(
    dataset, shortcut, reason
):
    # Why: the dataset's own scorer gives full marks to an answer that solves nothing.
    generated = reasoning_gym.create_dataset(dataset, seed=0, size=3)
    assert max(generated.score_answer(shortcut, generated[i]) for i in range(3)) == 1.0
    with pytest.raises(ConfigError, match=rf"{dataset}.*{reason}"):
        reasoning_gym_tasks(dataset, size=1, seed=0)
    with pytest.raises(ConfigError, match=rf"evaluator\.dataset: .*{dataset}.*{reason}"):
        build_evaluator({"type": "reasoning_gym", "dataset": dataset})


@needs_landlock
@pytest.mark.parametrize("dataset", sorted({dataset for dataset, _, _ in REFUSED}))
def test_a_refused_datasets_task_is_not_scored(scorer, dataset):
    task = {"dataset": dataset, "question": "q", "hidden": {"answer": "1", "metadata": {}}}
    reply = request(scorer, task, "banana")
    assert reply["outcome"] == "task_error" and f"{dataset!r} is refused" in reply["error"]


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


@needs_landlock
def test_answers_scored_while_the_process_regenerates_entries_are_judged_by_their_result():
    """The process regenerates each request's entry (knight_swap: 0.5-1 s) before it forks the answer's
    child. It used to regenerate every request of a batch before it looked at its children again,
    then mark killed every child past its deadline, those that had exited with their score included:
    right answers came back as timeouts. Now requests start one at a time, and a child that exited
    before its deadline was handled is judged by its result."""
    task = reasoning_gym_tasks("knight_swap", size=1, seed=0)[0].data
    process = ScorerProcess(MODULE)
    # 12 requests: regenerating the 11 queued behind the first takes several times its 2 s timeout.
    gold = {"task": task, "text": task["hidden"]["answer"], "raw": True, "timeout_s": 2}

    async def run() -> list[dict[str, Any]]:
        try:
            return await asyncio.gather(*(process.request(gold, timeout_s=120) for _ in range(12)))
        finally:
            await process.aclose()

    replies = asyncio.run(run())
    assert [(r["outcome"], r.get("score")) for r in replies] == [("scored", 1.0)] * 12, replies


@needs_landlock
@pytest.mark.parametrize("timeout_s", [1e7, float("inf")])
def test_a_huge_timeout_is_clamped_and_does_not_end_the_process(timeout_s):
    """A deadline past ~24 days overflowed select's timeout and ended the process on every request
    (the evaluator's config now refuses such a timeout_s; the process clamps what it is sent)."""
    process = ScorerProcess(MODULE)
    task = reasoning_gym_tasks("basic_arithmetic", size=1, seed=0)[0].data

    async def run() -> dict[str, Any]:
        try:
            return await process.request(
                {"task": task, "text": task["hidden"]["answer"], "raw": True, "timeout_s": timeout_s},
                timeout_s=60,
            )
        finally:
            await process.aclose()

    reply = asyncio.run(run())
    assert (reply["outcome"], reply.get("score"), process.starts) == ("scored", 1.0, 1)


@pytest.mark.parametrize("timeout_s", [float("inf"), float("nan"), 86_400.5, 1e7])
def test_the_evaluator_refuses_a_timeout_past_a_day(timeout_s):
    with pytest.raises(ConfigError, match=r"evaluator\..*timeout_s"):
        parse_evaluator_config({"type": "reasoning_gym", "timeout_s": timeout_s})
    assert parse_evaluator_config({"type": "reasoning_gym", "timeout_s": 86_400}).timeout_s == 86_400


@needs_landlock
def test_a_score_above_one_is_out_of_range_and_pays_nothing(scorer):
    """spell_backward scores its gold with junk after it 1.0000000000000002 (a float error): not a
    full score to clamp to 1.0 (that would pay the junk), but a result outside [0, 1]."""
    task = reasoning_gym_tasks("spell_backward", size=1, seed=0)[0].data
    junk = f"{task['hidden']['answer']}0"
    assert score_answer(task, junk) > 1.0  # why
    reply = request(scorer, task, junk)
    assert reply["outcome"] == "failed" and reply.get("out_of_range") is True, reply
    assert "1.0000000000000002" in reply["error"]
    for strict in (True, False):
        evaluator = build_evaluator({"type": "reasoning_gym", "source": "stdout", "strict": strict})
        inp = EvaluationInput(task=task, workspace=Path("/tmp"), stdout=f"Answer: {junk}")

        async def run(evaluator=evaluator, inp=inp) -> Any:
            try:
                return await evaluator.evaluate(inp)
            finally:
                await evaluator.aclose()

        result = asyncio.run(run())
        assert result.reward == 0.0 and result.flags == ("scorer_out_of_range",), result
    assert request(scorer, task, task["hidden"]["answer"])["score"] == 1.0  # control: the gold pays


def test_a_dataset_whose_partial_credit_pays_a_guess_is_scored_strictly_even_with_strict_off():
    """time_intervals' partial credit shrinks with the distance to the gold: "0" earns most of a
    point. With ``strict = false`` it is still scored all or nothing; the gold still pays 1."""
    task = next(
        t.data
        for t in reasoning_gym_tasks("time_intervals", size=20, seed=0)
        if 0.5 < score_answer(t.data, "0") < 1.0
    )
    evaluator = build_evaluator({"type": "reasoning_gym", "source": "stdout", "strict": False})

    async def run() -> list[float]:
        try:
            return [
                (
                    await evaluator.evaluate(
                        EvaluationInput(task=task, workspace=Path("/tmp"), stdout=f"Answer: {a}")
                    )
                ).reward
                for a in ("0", task["hidden"]["answer"])
            ]
        finally:
            await evaluator.aclose()

    assert asyncio.run(run()) == [0.0, 1.0]


def test_a_result_nested_past_the_parsers_depth_is_no_result():
    """Defence in depth: a child's output is parsed by the process; nesting past json's recursion
    limit raised RecursionError there (only ValueError was caught) and would end the process."""
    from harnessrl.tasks.reasoning_gym_scorer import _parse_result

    assert _parse_result(b'{"score": 1.0}\n' + b"[" * 50_000) == {}  # under the output limit
    assert _parse_result(b'{"score": 1.0}\n') == {"score": 1.0}  # control
