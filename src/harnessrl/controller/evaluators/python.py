"""The ``python`` evaluator: a user's ``package.module:function`` called with the ``EvaluationInput``.

The function is imported once (at config time by ``validate()``: an unimportable or missing one is
a ``ConfigError``) and called in-process: a coroutine function is awaited, a plain one runs in a
thread. It may return a number, an ``EvaluationResult`` or a mapping with ``"reward"`` (the rest
becomes the details). A timeout or an exception it raises is an ``EvaluatorError``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from harnessrl.controller.evaluators.config import PythonEvaluatorConfig
from harnessrl.controller.evaluators.types import (
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    checked_result,
    scorer_flags,
)
from harnessrl.errors import ConfigError


class PythonEvaluator:
    def __init__(self, config: PythonEvaluatorConfig):
        self.config = config
        self._function: Any = None

    def validate(self) -> None:
        self._load()

    def _load(self) -> Any:
        if self._function is None:
            module_name, _, attr = self.config.function.partition(":")
            try:
                target: Any = importlib.import_module(module_name)
            except Exception as exc:  # any import-time failure is a config problem
                raise ConfigError(f"evaluator.function: cannot import {module_name!r}: {exc}") from exc
            for part in attr.split("."):
                if not hasattr(target, part):
                    raise ConfigError(f"evaluator.function: {module_name!r} has no attribute {attr!r}")
                target = getattr(target, part)
            if not callable(target):
                raise ConfigError(f"evaluator.function: {self.config.function!r} is not callable")
            self._function = target
        return self._function

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        try:
            function = self._load()
        except ConfigError as exc:
            raise EvaluatorError(str(exc)) from exc
        try:
            if inspect.iscoroutinefunction(function):
                result = await asyncio.wait_for(function(inp, **self.config.kwargs), self.config.timeout_s)
            else:
                # A thread cannot be killed: on timeout we stop waiting and it finishes on its own.
                result = await asyncio.wait_for(
                    asyncio.to_thread(function, inp, **self.config.kwargs), self.config.timeout_s
                )
        except TimeoutError as exc:
            raise EvaluatorError(
                f"{self.config.function} timed out after {self.config.timeout_s:g}s"
            ) from exc
        except Exception as exc:  # the scorer crashed: infrastructure, not the policy's doing
            raise EvaluatorError(f"{self.config.function} raised {type(exc).__name__}: {exc}") from exc
        # Flags come through as the scorer gave them: an ``EvaluationResult``'s, or a mapping's
        # ``"flags"`` list (the same names a command scorer's JSON verdict may report).
        if isinstance(result, EvaluationResult):
            checked = checked_result(result.reward, dict(result.details))
            return EvaluationResult(checked.reward, checked.details, scorer_flags(result.flags))
        if isinstance(result, Mapping) and "reward" in result:
            details = dict(result)
            checked = checked_result(details.pop("reward"), details)
            return EvaluationResult(checked.reward, checked.details, scorer_flags(details.get("flags")))
        return checked_result(result, {})
