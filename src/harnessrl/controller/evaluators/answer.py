"""The answer-based evaluators: ``reasoning_gym`` and ``exact_match``.

Both read the rollout's answer (by default its final assistant text, as
``EvaluationInput.final_answer`` defines it; ``source = "stdout"`` reads the harness's stdout
instead, ``<think>`` blocks removed by ``answers.strip_think``, in one pass) and pull it out with
``harnessrl.tasks.answers.extract_answer``, in a worker thread.

``reasoning_gym`` scores with the task's reasoning-gym dataset, whose scorers may evaluate the
answer as code: never in the controller. The text goes to a scorer process of this evaluator's own
(``ScorerProcess`` running ``harnessrl.tasks.reasoning_gym_scorer``, started on first use), which
extracts and scores each answer in a confined child and reports what happened. The outcome is the
policy's (reward 0 with a flag) when the answer made the scorer raise (``scorer_raised``), run out of
time (``scorer_timeout``) or die (``scorer_failed``); an ``EvaluatorError`` (infrastructure) when the
task's entry cannot be regenerated, a child cannot be confined, or the scorer process cannot run.
Where the machine cannot confine the scorer (no Landlock, no libseccomp) it refuses to start, unless
``isolation = "available"``, which scores with what there is and flags ``weak_isolation``.

``exact_match`` compares with a gold answer kept under the task's ``hidden`` fields, where the
harness cannot read it. Its ``pattern`` (the user's regular expression over the policy's text) runs
in a pattern process (``ScorerProcess`` running ``evaluators.pattern_scorer``), within ``timeout_s``
and ``memory_mb``: the engine holds the GIL while it matches, so a pattern that backtracks on what the
policy wrote would stall the controller's event loop even from a worker thread, and its backtracking
stack grows with the text. Past a limit the outcome is the policy's: reward 0 flagged
``pattern_timeout`` (``pattern_raised`` when matching raised, out of memory included), the reason in
``details.pattern_error``. Without a pattern the whole text is compared, in a worker thread (linear
in the text).

Each pattern process matches one answer at a time, and there are ``_PATTERN_PROCESSES`` of them
(each started when first needed): an answer goes to the one with the fewest answers waiting. With
one process for all, an answer that ran to ``timeout_s`` held every answer sent after it (up to 3
honest ones, each ``timeout_s`` late); now it holds only its own process, and an answer waits behind
it only when every process is busy. Its reply time limit counts from when it was sent, so that wait
is never an infrastructure failure.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from harnessrl.controller.evaluators.config import ExactMatchEvaluatorConfig, ReasoningGymEvaluatorConfig
from harnessrl.controller.evaluators.scorer_process import ScorerProcess, ScorerUnavailable
from harnessrl.controller.evaluators.types import (
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    checked_result,
)
from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import AnswerFallback, answers_match, extract_answer, strip_think
from harnessrl.tasks.fields import HIDDEN, get_field, is_hidden_path
from harnessrl.tasks.reasoning_gym import UNSAFE_WITHOUT_STRICT

SCORER_MODULE = "harnessrl.tasks.reasoning_gym_scorer"
# Flags of a reasoning_gym evaluation (reward 0): what the answer did to the dataset's scorer.
SCORER_RAISED = "scorer_raised"  # the scorer raised on this answer
SCORER_TIMEOUT = "scorer_timeout"  # past timeout_s (wall clock) or its CPU limit
SCORER_FAILED = "scorer_failed"  # died (memory, a signal) or gave no valid result
SCORER_OUT_OF_RANGE = "scorer_out_of_range"  # a score outside [0, 1] (spell_backward: gold + junk)
WEAK_ISOLATION = "weak_isolation"  # isolation = "available" and this machine lacks Landlock or seccomp
_FLAG_OF = {"raised": SCORER_RAISED, "timeout": SCORER_TIMEOUT, "failed": SCORER_FAILED}
# Beyond the answer's own timeout_s: regenerating an entry (a dataset's first use) and the fork.
_REPLY_GRACE_S = 60.0
PATTERN_MODULE = "harnessrl.controller.evaluators.pattern_scorer"
# Flags of an exact_match evaluation (reward 0): what the policy's text did to the pattern.
PATTERN_TIMEOUT = "pattern_timeout"  # matching ran past timeout_s (a pattern that backtracks on it)
PATTERN_RAISED = "pattern_raised"  # matching raised (out of memory)
_PATTERN_FLAG_OF = {"timeout": PATTERN_TIMEOUT, "raised": PATTERN_RAISED}
_PATTERN_PROCESSES = 4  # pattern processes, each matching one answer at a time
# Characters of text per byte of the pattern process's memory_mb: a request line holds up to 12 bytes
# per character (JSON's \ud83d\ude00 for one past the BMP) and the parsed text 4 more, so a longer
# text could not even be read there (the process died on it, twice: an infrastructure failure the
# policy chose).
_TEXT_PER_MEMORY = 1 / 32


def _compile(pattern: str | None, where: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: invalid regular expression {pattern!r}: {exc}") from exc


def source_text(inp: EvaluationInput, source: str) -> str:
    """The text the answer is read from: the final answer, or stdout without its ``<think>`` blocks."""
    return inp.final_answer if source == "final_answer" else strip_think(inp.stdout)


def _extracted(
    inp: EvaluationInput, source: str, pattern: re.Pattern[str] | None, fallback: AnswerFallback
) -> str | None:
    return extract_answer(source_text(inp, source), pattern, fallback)


class ReasoningGymEvaluator:
    def __init__(self, config: ReasoningGymEvaluatorConfig, *, scorer: ScorerProcess | None = None):
        self.config = config
        self._pattern = _compile(config.answer_pattern, "evaluator.answer_pattern")
        # One scorer process per evaluator, started on first use (tests pass their own).
        self.scorer = scorer or ScorerProcess(SCORER_MODULE, ["--isolation", config.isolation])

    def validate(self) -> None:
        try:
            import reasoning_gym  # noqa: F401  (slow import, only when this evaluator is used)
        except ImportError as exc:
            raise ConfigError("evaluator.type: reasoning_gym needs the reasoning-gym package") from exc
        from harnessrl.sandbox.forked import isolation_problem
        from harnessrl.tasks.reasoning_gym import dataset_names, refusal

        if self.config.dataset is not None and self.config.dataset not in dataset_names():
            raise ConfigError(f"evaluator.dataset: unknown reasoning-gym dataset {self.config.dataset!r}")
        if self.config.dataset is not None and refusal(self.config.dataset):
            raise ConfigError(f"evaluator.dataset: {refusal(self.config.dataset)}")
        problem = isolation_problem() if self.config.isolation == "required" else None
        if problem is not None:
            raise ConfigError(
                "evaluator.isolation: reasoning-gym scorers may evaluate the answer as code, and the "
                f'scorer cannot be confined here: {problem}. isolation = "available" scores without '
                "it (unsafe for training: the answer's code could reach what the scorer process can)"
            )

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        task = (
            inp.task
            if "dataset" in inp.task or self.config.dataset is None
            else {**inp.task, "dataset": self.config.dataset}
        )
        # Only the text is found here; the answer is extracted in the scorer's child, where a
        # pattern that backtracks on what the policy wrote costs that child's time limit, not ours.
        text = await asyncio.to_thread(source_text, inp, self.config.source)
        request = {
            "task": task,
            "text": text,
            "pattern": self.config.answer_pattern,
            "fallback": self.config.fallback,
            "timeout_s": self.config.timeout_s,
            "memory_mb": self.config.memory_mb,
        }
        try:
            reply = await self.scorer.request(request, timeout_s=self.config.timeout_s + _REPLY_GRACE_S)
        except ScorerUnavailable as exc:
            raise EvaluatorError(f"reasoning-gym scorer: {exc}") from exc
        return self._result(reply, task.get("dataset"))

    def _result(self, reply: dict[str, Any], dataset: Any) -> EvaluationResult:
        outcome = reply.get("outcome")
        details: dict[str, Any] = {"extracted": reply.get("extracted"), "dataset": dataset}
        if outcome in ("task_error", "isolation_error"):  # before the answer was read: not the policy's
            raise EvaluatorError(f"reasoning-gym scoring failed ({outcome}): {reply.get('error')}")
        flags = () if reply.get("isolation") == "full" else (WEAK_ISOLATION,)
        if outcome in _FLAG_OF:
            details.update(score=0.0, scorer_error=reply.get("error"))
            flag = (
                SCORER_OUT_OF_RANGE
                if outcome == "failed" and reply.get("out_of_range")
                else _FLAG_OF[outcome]
            )
            return EvaluationResult(0.0, details, (flag, *flags))
        if outcome not in ("scored", "no_answer"):
            raise EvaluatorError(f"reasoning-gym scorer sent an unknown outcome: {outcome!r}")
        score = reply.get("score")
        details["score"] = score
        if not isinstance(score, int | float):
            raise EvaluatorError(f"reasoning-gym scorer sent no score: {reply!r}")
        # A dataset whose partial credit pays for a guess is scored strictly whatever ``strict`` says.
        strict = self.config.strict or dataset in UNSAFE_WITHOUT_STRICT
        reward = (1.0 if score >= 1.0 else 0.0) if strict else score
        result = checked_result(reward, details)
        return EvaluationResult(result.reward, result.details, flags)

    async def aclose(self) -> None:
        """Stop the scorer process (a later evaluation starts a new one)."""
        await self.scorer.aclose()


class ExactMatchEvaluator:
    def __init__(self, config: ExactMatchEvaluatorConfig, *, matchers: Sequence[ScorerProcess] = ()):
        self.config = config
        self._pattern = _compile(config.pattern, "evaluator.pattern")
        # Each started when an answer is first sent to it (tests pass their own).
        args = ["--memory-mb", str(config.memory_mb)]
        self.matchers = list(matchers) or [
            ScorerProcess(PATTERN_MODULE, args, max_in_flight=1) for _ in range(_PATTERN_PROCESSES)
        ]
        self._waiting = [0] * len(self.matchers)  # answers sent to or waiting for each
        # The gold answer must be where the harness cannot read it.
        if config.field == HIDDEN:
            raise ConfigError(f"evaluator.field: name a field under {HIDDEN}, e.g. '{HIDDEN}.answer'")
        if not is_hidden_path(config.field):
            raise ConfigError(
                f"evaluator.field: {config.field!r} is visible to the harness; "
                f"put it under {HIDDEN} and use '{HIDDEN}.{config.field}'"
            )

    def validate(self) -> None:
        """Nothing to check beyond the pattern, compiled in the constructor."""

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        try:
            gold = get_field(inp.task, self.config.field)
        except KeyError:
            raise EvaluatorError(f"exact_match: the task has no field {self.config.field!r}") from None
        golds = [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]  # any of several
        if self._pattern is None:  # the whole text: linear in it, so a worker thread is enough
            answer = await asyncio.to_thread(_extracted, inp, self.config.source, None, self.config.fallback)
            hit = answer is not None and any(
                answers_match(answer, g, normalize=self.config.normalize) for g in golds
            )
            return EvaluationResult(1.0 if hit else 0.0, {"extracted": answer, "gold": gold})
        return await self._matched_by_pattern(inp, gold, golds)

    async def _matched_by_pattern(
        self, inp: EvaluationInput, gold: Any, golds: list[str]
    ) -> EvaluationResult:
        """The pattern runs in the pattern process, never here: it holds the GIL while it matches, and
        what it matches is the policy's."""
        text = await asyncio.to_thread(source_text, inp, self.config.source)
        most = int((self.config.memory_mb << 20) * _TEXT_PER_MEMORY)
        if len(text) > most:
            error = f"the text ({len(text)} characters) is longer than memory_mb lets it be read ({most})"
            details = {"extracted": None, "gold": gold, "pattern_error": error}
            return EvaluationResult(0.0, details, (PATTERN_RAISED,))
        request = {
            "text": text,
            "pattern": self.config.pattern,
            "fallback": self.config.fallback,
            "golds": golds,
            "normalize": self.config.normalize,
            "timeout_s": self.config.timeout_s,
        }
        index = min(range(len(self.matchers)), key=self._waiting.__getitem__)
        self._waiting[index] += 1
        try:
            reply = await self.matchers[index].request(
                request, timeout_s=self.config.timeout_s + _REPLY_GRACE_S
            )
        except ScorerUnavailable as exc:
            raise EvaluatorError(f"exact_match pattern process: {exc}") from exc
        finally:
            self._waiting[index] -= 1
        outcome = reply.get("outcome")
        if outcome in _PATTERN_FLAG_OF:  # the policy's text did it: its 0, with a named reason
            details = {"extracted": None, "gold": gold, "pattern_error": reply.get("error")}
            return EvaluationResult(0.0, details, (_PATTERN_FLAG_OF[outcome],))
        if outcome != "matched" or not isinstance(reply.get("hit"), bool):
            raise EvaluatorError(f"exact_match pattern process sent an unknown reply: {str(reply)[:300]}")
        return EvaluationResult(
            1.0 if reply["hit"] else 0.0, {"extracted": reply.get("extracted"), "gold": gold}
        )

    async def aclose(self) -> None:
        """Stop the pattern processes (a later evaluation starts new ones)."""
        await asyncio.gather(*(matcher.aclose() for matcher in self.matchers))
