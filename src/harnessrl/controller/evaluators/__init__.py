"""Evaluators: the reward of a finished rollout, computed outside the agent.

The harness never reports its own reward (its rollout key cannot set one); after it exits the
controller hands an ``EvaluationInput`` (task, workspace, recorded calls, exit, stdout) to the task's
evaluator. Four kinds, chosen by ``type`` in the config:

- ``command``: a program run in the workspace (e.g. the task's tests); reward from its exit code,
  the last stdout line as a float, or the last stdout line as JSON ``{"reward": x, ...}``.
- ``python``: ``package.module:function`` called with the ``EvaluationInput``.
- ``reasoning_gym``: the answer extracted from the final assistant message, scored by the task's
  reasoning-gym dataset.
- ``exact_match``: the extracted answer against a hidden task field (``hidden.answer``).

Evaluators see the whole task, ``hidden`` included: that is where a task keeps its answer, gold
patch or hidden tests, which the harness never sees (``harnessrl.tasks.fields``).

``validate()`` runs at config time (missing executable, unimportable function, bad regex ->
``ConfigError`` naming the field). A failure of the evaluator itself at run time (a crash, a scorer
that did not start) raises ``EvaluatorError``, which the controller records as an infrastructure
failure: a broken scorer must never look like a policy that earned 0. What the scored code or the
policy controls is the policy's 0 with a flag instead (docs/evaluators.md): a command scorer's
unparsable or out-of-range verdict, its timeout, a scorer program in the workspace the policy
deleted.

This module is the registry: ``build_evaluator`` maps a config to its evaluator, and every public
name is importable from here. The config classes and ``parse_evaluator_config`` are in
``evaluators.config``; the inputs and results in ``evaluators.types``; the kinds in
``evaluators.command`` (with its sandboxed process runner; what its sandbox holds in
``evaluators.staging``, its verdict read in ``evaluators.verdict``), ``evaluators.python`` and
``evaluators.answer`` (``reasoning_gym`` and ``exact_match``). ``final_answer_text`` lives in
``harnessrl.tasks.answers``, so task modules can use it without importing the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from harnessrl.controller.evaluators.answer import ExactMatchEvaluator, ReasoningGymEvaluator
from harnessrl.controller.evaluators.command import CommandEvaluator, EvaluatorSandbox
from harnessrl.controller.evaluators.config import (
    CommandEvaluatorConfig,
    EvaluatorConfig,
    ExactMatchEvaluatorConfig,
    PythonEvaluatorConfig,
    ReasoningGymEvaluatorConfig,
    parse_evaluator_config,
)
from harnessrl.controller.evaluators.python import PythonEvaluator
from harnessrl.controller.evaluators.types import EvaluationInput, EvaluationResult, EvaluatorError
from harnessrl.tasks.answers import final_answer_text

__all__ = [
    "CommandEvaluator",
    "CommandEvaluatorConfig",
    "EvaluationInput",
    "EvaluationResult",
    "Evaluator",
    "EvaluatorConfig",
    "EvaluatorError",
    "ExactMatchEvaluator",
    "ExactMatchEvaluatorConfig",
    "PythonEvaluator",
    "PythonEvaluatorConfig",
    "ReasoningGymEvaluator",
    "ReasoningGymEvaluatorConfig",
    "build_evaluator",
    "final_answer_text",
    "parse_evaluator_config",
]


class Evaluator(Protocol):
    #: What it was built from; ``config.check_task`` says whether a task can be scored at all.
    config: EvaluatorConfig

    def validate(self) -> None:
        """Raise ``ConfigError`` if this evaluator cannot work at all (before any rollout starts)."""

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult: ...


def build_evaluator(
    config: EvaluatorConfig | Mapping[str, Any],
    *,
    validate: bool = True,
    sandbox: EvaluatorSandbox | None = None,
) -> Evaluator:
    """The evaluator for ``config``, validated unless ``validate=False``.

    ``sandbox`` is how a command evaluator is isolated (default: a fresh bubblewrap sandbox over a
    copy of the workspace, ``EvaluatorSandbox()``); ``EvaluatorSandbox("none")`` runs it directly.
    """
    if isinstance(config, Mapping):
        config = parse_evaluator_config(config)
    evaluator: Evaluator
    if isinstance(config, CommandEvaluatorConfig):
        evaluator = CommandEvaluator(config, sandbox=sandbox)
    elif isinstance(config, PythonEvaluatorConfig):
        evaluator = PythonEvaluator(config)
    elif isinstance(config, ReasoningGymEvaluatorConfig):
        evaluator = ReasoningGymEvaluator(config)
    else:
        evaluator = ExactMatchEvaluator(config)
    if validate:
        evaluator.validate()
    return evaluator
