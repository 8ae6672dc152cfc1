"""What evaluators receive and return: ``EvaluationInput``, ``EvaluationResult``, ``EvaluatorError``.

Shared by every evaluator kind (``evaluators.command``, ``evaluators.python``, ``evaluators.answer``)
and the controller, which imports them from ``harnessrl.controller.evaluators``. ``checked_result``
is the one check every kind applies to the reward it computed: a finite number, else an
``EvaluatorError``. ``EvaluationInput.final_answer`` is ``harnessrl.tasks.answers.final_answer_text``
of the rollout's calls.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.errors import HarnessRLError
from harnessrl.sandbox.rootfs import ImageRoot
from harnessrl.schemas import Call
from harnessrl.tasks.answers import final_answer_text


class EvaluatorError(HarnessRLError):
    """The evaluation could not be carried out for a reason that is not the policy's (a task field
    missing, the scorer's sandbox could not start, a Python evaluator crashed): an infrastructure
    failure. A command scorer that ran and then failed is the policy's outcome, not this."""


@dataclass(frozen=True)
class EvaluationInput:
    task: dict[str, Any]
    workspace: Path
    calls: Sequence[Call] = ()
    exit_code: int | None = None
    exit_kind: str = "exited"  # an ``ExitKind`` value
    stdout: str = ""  # the harness's stdout
    task_file: Path | None = None  # the task JSON the harness saw; written to a temp file if None
    rollout_id: str = ""
    # The task's environment (docs/environments.md): a command scorer's sandbox runs on the same
    # image as the harness did. None: the host's system folders.
    environment: ImageRoot | None = None

    @property
    def final_answer(self) -> str:
        """The content of the main conversation's last assistant message with text, ``<think>`` blocks
        removed (``tasks.answers.final_answer_text``: a harness's side call after the answer is skipped)."""
        return final_answer_text(self.calls)


@dataclass(frozen=True)
class EvaluationResult:
    reward: float
    details: dict[str, Any] = field(default_factory=dict)
    # Named findings about how the rollout was scored (``scorer_failed``, ``reward_out_of_range``, a
    # scorer's own ``verdict_disagreement``...): recorded with the rollout like the audit's flags.
    flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Whatever evaluator made it (one of ours, or a caller's own): the store refuses a reward
        # that is not finite, and the controller treats this error as the evaluation failing.
        if not _finite(self.reward):
            raise EvaluatorError(
                f"evaluator produced a reward that is not a finite number: {repr(self.reward)[:200]}"
            )


def checked_result(reward: Any, details: dict[str, Any]) -> EvaluationResult:
    """``EvaluationResult(reward, details)`` if ``reward`` is a finite number, else ``EvaluatorError``.
    A NumPy scalar is the number it holds: a scoring function's ``np.sum(hits)`` (``int64``),
    ``(a == b).all()`` (``bool_``) or ``float32`` mean failed every evaluation as "not a finite number"."""
    reward = _plain_number(reward)
    if isinstance(reward, bool | int | float) and _finite(reward):
        return EvaluationResult(float(reward), details)
    raise EvaluatorError(f"evaluator produced a reward that is not a finite number: {repr(reward)[:200]}")


def _plain_number(value: Any) -> Any:
    """``value`` as a Python number when it is a NumPy scalar or another real number type
    (``Fraction``); anything else unchanged."""
    if isinstance(value, bool | int | float):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "shape", None) == ():
        value = value.item()  # np.bool_ -> bool, np.int64 -> int, np.float32 -> float
    if not isinstance(value, bool | int | float) and isinstance(value, numbers.Real):
        with contextlib.suppress(OverflowError, ValueError):  # past the float range: refused as is
            value = float(value)
    return value


def _finite(number: float) -> bool:
    """A finite float, or an int a float can hold: ``math.isfinite(10**400)`` raises OverflowError,
    which would reach the controller as a crash instead of this module's ``EvaluatorError``."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


_SCORER_FLAG = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def scorer_flags(reported: Any) -> tuple[str, ...]:
    """The flags a scorer reported (a JSON verdict's or a python scorer's ``"flags"``): names like
    ``action_log_missing``, at most 16, each once; anything else in the list is dropped."""
    if not isinstance(reported, list | tuple):
        return ()
    return tuple(dict.fromkeys(f for f in reported if isinstance(f, str) and _SCORER_FLAG.match(f)))[:16]
