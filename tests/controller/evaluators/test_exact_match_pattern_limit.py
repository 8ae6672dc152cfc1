"""``exact_match``'s ``pattern`` over adversarial text: the pattern ran in the controller (a worker
thread, but the regular-expression engine holds the GIL), with no time limit, so a policy that wrote
160 KB of ``\\boxed{`` for ``'\\\\boxed\\{(.*)\\}'`` stalled the event loop for 8 s (every other
rollout's scoring, the gateway bridge, heartbeats). Now the pattern runs in a process of its own
(``evaluators.pattern_scorer``) within ``timeout_s``: past it, reward 0 flagged ``pattern_timeout``
with the reason in the details, while the event loop goes on. The control: an honest answer still
earns 1 from the same evaluator, a wrong one 0."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput, EvaluationResult

BOXED = r"\\boxed\{(.*)\}"
ATTACK = "\\boxed{" * 23_000  # 161 KB: quadratic backtracking for BOXED, ~8 s of held GIL
TASK = {"prompt": "6 * 7?", "hidden": {"answer": "42"}}


async def _evaluate_while_probing(evaluator, reply: str, tmp_path: Path) -> tuple[EvaluationResult, int]:
    """The evaluation's result, and how many turns a probe on the same event loop got meanwhile."""
    done = asyncio.Event()
    turns = 0

    async def probe() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await asyncio.sleep(0.01)

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0)
    try:
        result = await evaluator.evaluate(EvaluationInput(task=TASK, workspace=tmp_path, stdout=reply))
    finally:
        done.set()
        await probing
    return result, turns


def test_a_backtracking_pattern_is_cut_at_its_limit_and_the_loop_stays_responsive(tmp_path):
    evaluator = build_evaluator(
        {"type": "exact_match", "source": "stdout", "pattern": BOXED, "timeout_s": 0.5}
    )

    async def scenario() -> tuple[EvaluationResult, int, EvaluationResult, EvaluationResult]:
        try:
            attacked, turns = await _evaluate_while_probing(evaluator, ATTACK, tmp_path)
            # The control, on the same evaluator after the timeout: the process answers on.
            honest, _ = await _evaluate_while_probing(evaluator, "so \\boxed{42}.", tmp_path)
            wrong, _ = await _evaluate_while_probing(evaluator, "\\boxed{41}", tmp_path)
            return attacked, turns, honest, wrong
        finally:
            await evaluator.aclose()

    attacked, turns, honest, wrong = asyncio.run(scenario())
    assert attacked.reward == 0.0
    assert attacked.flags == ("pattern_timeout",)
    assert "time limit" in attacked.details["pattern_error"]
    assert turns >= 5, f"the event loop was held: the probe ran {turns} times while the pattern matched"
    assert (honest.reward, honest.details["extracted"], honest.flags) == (1.0, "42", ())
    assert (wrong.reward, wrong.details["extracted"]) == (0.0, "41")


def test_a_huge_extracted_answer_is_reported_capped_and_still_compared_whole(tmp_path):
    """The answer is compared in the pattern process; only a capped copy comes back."""
    evaluator = build_evaluator({"type": "exact_match", "source": "stdout", "pattern": r"Answer:\s*(.+)"})

    async def scenario() -> tuple[EvaluationResult, EvaluationResult]:
        try:
            long_wrong = await evaluator.evaluate(
                EvaluationInput(task=TASK, workspace=tmp_path, stdout="Answer: " + "42" * 3_000_000)
            )
            right = await evaluator.evaluate(
                EvaluationInput(task=TASK, workspace=tmp_path, stdout="Answer: 42")
            )
            return long_wrong, right
        finally:
            await evaluator.aclose()

    long_wrong, right = asyncio.run(scenario())
    assert long_wrong.reward == 0.0 and len(long_wrong.details["extracted"]) == 4096
    assert right.reward == 1.0


# A match that keeps a backtracking state per character: 1 MB of digits costs ~175 MB unbounded.
GREEDY_GROUPS = r"^((?:(\d)|,)*)$"


def test_a_memory_hungry_match_is_cut_at_memory_mb_and_the_next_answer_is_scored(tmp_path):
    """The pattern process had no memory limit: the policy's text chose how much memory a match took
    (``GREEDY_GROUPS`` over 1 MB of digits: ~175 MB; more groups, more per character). Now past
    ``memory_mb`` the answer earns 0 flagged ``pattern_raised``, and the same process answers on."""
    evaluator = build_evaluator(
        {"type": "exact_match", "source": "stdout", "pattern": GREEDY_GROUPS, "memory_mb": 64}
    )

    async def scenario() -> tuple[EvaluationResult, EvaluationResult, int | None, int | None]:
        try:
            hungry = await evaluator.evaluate(
                EvaluationInput(task=TASK, workspace=tmp_path, stdout="4" * 1_000_000)
            )
            pid = evaluator.matchers[0].pid
            honest = await evaluator.evaluate(EvaluationInput(task=TASK, workspace=tmp_path, stdout="42"))
            return hungry, honest, pid, evaluator.matchers[0].pid
        finally:
            await evaluator.aclose()

    hungry, honest, pid_before, pid_after = asyncio.run(scenario())
    assert (hungry.reward, hungry.flags) == (0.0, ("pattern_raised",))
    assert "MemoryError" in hungry.details["pattern_error"]
    assert (honest.reward, honest.details["extracted"], honest.flags) == (1.0, "42", ())
    assert pid_before is not None and pid_before == pid_after  # not killed and restarted


def test_an_answer_matched_to_its_time_limit_does_not_hold_an_honest_one(tmp_path):
    """One pattern process matched every answer in turn: an answer that ran to ``timeout_s`` held
    each honest answer sent after it (up to 3 of them, each ``timeout_s`` late). Now an honest answer
    goes to a process that is free and is scored while the attack still runs."""
    evaluator = build_evaluator({"type": "exact_match", "source": "stdout", "pattern": BOXED, "timeout_s": 2})

    def evaluate(reply: str) -> asyncio.Task[EvaluationResult]:
        inp = EvaluationInput(task=TASK, workspace=tmp_path, stdout=reply)
        return asyncio.ensure_future(evaluator.evaluate(inp))

    async def scenario() -> tuple[asyncio.Task[EvaluationResult], asyncio.Task[EvaluationResult], bool]:
        # One worker thread: each evaluation reads its text in the order it was started, so the
        # attack is sent to its process before the honest answer is.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        try:
            await asyncio.gather(evaluate("\\boxed{42}"), evaluate("\\boxed{42}"))  # two processes up
            attack, honest = evaluate(ATTACK), evaluate("so \\boxed{42}.")
            done, _ = await asyncio.wait({attack, honest}, return_when=asyncio.FIRST_COMPLETED)
            honest_first = honest in done and attack not in done
            await asyncio.gather(attack, honest)
            return attack, honest, honest_first
        finally:
            await evaluator.aclose()

    attack, honest, honest_first = asyncio.run(scenario())
    assert honest_first, "the honest answer waited for the attack's time limit"
    assert (honest.result().reward, honest.result().flags) == (1.0, ())
    assert (attack.result().reward, attack.result().flags) == (0.0, ("pattern_timeout",))


def test_a_text_too_long_to_read_within_memory_mb_earns_zero_not_an_infrastructure_failure(tmp_path):
    """A text the pattern process could not read within its memory cap (64 MB: 3M characters past the
    BMP make a 36 MB request line) killed it twice, and the evaluation failed as an infrastructure
    failure (retried, out of the baseline). Past 1/32 of ``memory_mb`` (2M characters here) the text
    is now the policy's 0, never sent."""
    evaluator = build_evaluator(
        {"type": "exact_match", "source": "stdout", "pattern": GREEDY_GROUPS, "memory_mb": 64}
    )

    async def scenario() -> EvaluationResult:
        try:
            return await evaluator.evaluate(
                EvaluationInput(task=TASK, workspace=tmp_path, stdout="\U0001f600" * 3_000_000)
            )
        finally:
            await evaluator.aclose()

    result = asyncio.run(scenario())
    assert (result.reward, result.flags) == (0.0, ("pattern_raised",))
    assert "memory_mb" in result.details["pattern_error"]
