"""``exact_match``'s ``pattern`` over adversarial text: the pattern ran in the controller (a worker
thread, but the regular-expression engine holds the GIL), with no time limit, so a policy that wrote
160 KB of ``\\boxed{`` for ``'\\\\boxed\\{(.*)\\}'`` stalled the event loop for 8 s (every other
rollout's scoring, the gateway bridge, heartbeats). Now the pattern runs in a process of its own
(``evaluators.pattern_scorer``) within ``timeout_s``: past it, reward 0 flagged ``pattern_timeout``
with the reason in the details, while the event loop goes on. The control: an honest answer still
earns 1 from the same evaluator, a wrong one 0."""

from __future__ import annotations

import asyncio
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
