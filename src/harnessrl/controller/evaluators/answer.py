"""The answer-based evaluators: ``reasoning_gym`` and ``exact_match``.

Both read the rollout's answer (by default its final assistant text, ``EvaluationInput.final_answer``;
``source = "stdout"`` reads the harness's stdout instead), pull it out with
``harnessrl.tasks.answers.extract_answer`` and score it: ``reasoning_gym`` with the task's
reasoning-gym dataset (``harnessrl.tasks.reasoning_gym.score_answer``, imported only when used: the
package takes seconds to import), ``exact_match`` against a gold answer kept under the task's
``hidden`` fields, where the harness cannot read it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from harnessrl.controller.evaluators.config import ExactMatchEvaluatorConfig, ReasoningGymEvaluatorConfig
from harnessrl.controller.evaluators.types import (
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    checked_result,
)
from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import THINK, answers_match, extract_answer
from harnessrl.tasks.fields import HIDDEN, get_field, is_hidden_path


def _compile(pattern: str | None, where: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"{where}: invalid regular expression {pattern!r}: {exc}") from exc


def _answer_source(inp: EvaluationInput, source: str) -> str:
    return inp.final_answer if source == "final_answer" else THINK.sub("", inp.stdout)


class ReasoningGymEvaluator:
    def __init__(self, config: ReasoningGymEvaluatorConfig):
        self.config = config
        self._pattern = _compile(config.answer_pattern, "evaluator.answer_pattern")

    def validate(self) -> None:
        try:
            import reasoning_gym  # noqa: F401  (slow import, only when this evaluator is used)
        except ImportError as exc:
            raise ConfigError("evaluator.type: reasoning_gym needs the reasoning-gym package") from exc
        from harnessrl.tasks.reasoning_gym import dataset_names

        if self.config.dataset is not None and self.config.dataset not in dataset_names():
            raise ConfigError(f"evaluator.dataset: unknown reasoning-gym dataset {self.config.dataset!r}")

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        from harnessrl.tasks.reasoning_gym import score_answer

        answer = extract_answer(_answer_source(inp, self.config.source), self._pattern, self.config.fallback)
        task = (
            inp.task
            if "dataset" in inp.task or self.config.dataset is None
            else {**inp.task, "dataset": self.config.dataset}
        )
        details: dict[str, Any] = {"extracted": answer, "dataset": task.get("dataset")}
        if answer is None:
            return EvaluationResult(0.0, {**details, "score": 0.0})
        try:
            score = await asyncio.wait_for(
                asyncio.to_thread(score_answer, task, answer), self.config.timeout_s
            )
        except TimeoutError as exc:
            raise EvaluatorError(f"reasoning-gym scoring timed out after {self.config.timeout_s:g}s") from exc
        except Exception as exc:  # unknown dataset, malformed task, a scorer bug: not the policy's fault
            raise EvaluatorError(f"reasoning-gym scoring failed: {type(exc).__name__}: {exc}") from exc
        reward = (1.0 if score >= 1.0 else 0.0) if self.config.strict else score
        return checked_result(reward, {**details, "score": score})


class ExactMatchEvaluator:
    def __init__(self, config: ExactMatchEvaluatorConfig):
        self.config = config
        self._pattern = _compile(config.pattern, "evaluator.pattern")
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
        answer = extract_answer(_answer_source(inp, self.config.source), self._pattern, self.config.fallback)
        hit = answer is not None and any(
            answers_match(answer, g, normalize=self.config.normalize) for g in golds
        )
        return EvaluationResult(1.0 if hit else 0.0, {"extracted": answer, "gold": gold})
