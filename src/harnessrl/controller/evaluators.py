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
``ConfigError`` naming the field). A failure of the evaluator itself at run time (timeout, crash,
unparsable output) raises ``EvaluatorError``, which the controller records as an infrastructure
failure: a broken scorer must never look like a policy that earned 0.

The inputs and results are defined in ``evaluator_types``, the command evaluator's process runner in
``evaluator_command``; every public name is importable from here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harnessrl.controller.evaluator_command import (
    EvaluatorSandbox,
    fill_placeholders,
    run_command,
    scrubbed_env,
)
from harnessrl.controller.evaluator_types import (
    THINK,
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    final_answer_text,
)
from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import AnswerFallback, answers_match, extract_answer
from harnessrl.tasks.fields import HIDDEN, get_field, is_hidden_path

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

# ---------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CommandEvaluatorConfig(_Config):
    type: Literal["command"] = "command"
    command: list[str] = Field(
        min_length=1, description="argv; {workspace} {task_file} {rollout_id} {task[F]}"
    )
    timeout_s: float = Field(default=120.0, gt=0)
    reward_from: Literal["exit_code", "stdout_float", "json"] = "exit_code"
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[str] = Field(
        default_factory=list,
        description="more host paths the scorer may read (bound read-only into its sandbox); the "
        "task's and the command's own absolute paths are bound already",
    )
    infra_exit_codes: list[int] = Field(
        default_factory=lambda: [125, 126, 127],
        description="exit codes meaning the scorer could not run (125: its sandbox failed)",
    )


class PythonEvaluatorConfig(_Config):
    type: Literal["python"] = "python"
    function: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="package.module:function")
    timeout_s: float = Field(default=60.0, gt=0)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments")


class ReasoningGymEvaluatorConfig(_Config):
    type: Literal["reasoning_gym"] = "reasoning_gym"
    answer_pattern: str = r"Answer:\s*(.+)"
    fallback: AnswerFallback = "last_line"
    strict: bool = True
    source: Literal["final_answer", "stdout"] = "final_answer"
    dataset: str | None = Field(default=None, description="used when the task has no 'dataset' field")
    timeout_s: float = Field(default=30.0, gt=0)


class ExactMatchEvaluatorConfig(_Config):
    type: Literal["exact_match"] = "exact_match"
    field: str = Field(default=f"{HIDDEN}.answer", description="dotted path of the gold answer, under hidden")
    pattern: str | None = None
    fallback: AnswerFallback = "none"
    normalize: bool = True
    source: Literal["final_answer", "stdout"] = "final_answer"


EvaluatorConfig = Annotated[
    CommandEvaluatorConfig | PythonEvaluatorConfig | ReasoningGymEvaluatorConfig | ExactMatchEvaluatorConfig,
    Field(discriminator="type"),
]
_CONFIG_ADAPTER: TypeAdapter[EvaluatorConfig] = TypeAdapter(EvaluatorConfig)


def parse_evaluator_config(data: Mapping[str, Any]) -> EvaluatorConfig:
    """Validate an evaluator section; errors become ``ConfigError`` naming ``evaluator.<field>``."""
    try:
        return _CONFIG_ADAPTER.validate_python(dict(data))
    except ValidationError as exc:
        problems = "; ".join(
            f"evaluator.{'.'.join(str(p) for p in err['loc']) or 'type'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(problems) from exc


class Evaluator(Protocol):
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


def _checked(reward: Any, details: dict[str, Any]) -> EvaluationResult:
    if isinstance(reward, bool | int | float) and math.isfinite(float(reward)):
        return EvaluationResult(float(reward), details)
    raise EvaluatorError(f"evaluator produced a reward that is not a finite number: {reward!r}")


# ---------------------------------------------------------------------------------------------------
# command
# ---------------------------------------------------------------------------------------------------

# Harness placeholders an evaluator has no value for; used only to give a clear config error.
_HARNESS_ONLY = re.compile(r"\{(base_url|anthropic_base_url|api_key|model|attempt)\}")


class CommandEvaluator:
    def __init__(self, config: CommandEvaluatorConfig, *, sandbox: EvaluatorSandbox | None = None):
        self.config = config
        # The sandbox's mode comes from the caller (the harness's); the paths to mount from this config.
        base = sandbox or EvaluatorSandbox()
        self.sandbox = dataclasses.replace(base, mounts=(*base.mounts, *(Path(m) for m in config.mounts)))

    def validate(self) -> None:
        for i, arg in enumerate([*self.config.command, *self.config.env.values()]):
            where = f"evaluator.command[{i}]" if i < len(self.config.command) else "evaluator.env"
            bad = _HARNESS_ONLY.search(arg)
            if bad:
                raise ConfigError(
                    f"{where}: {bad.group(0)} is not available to evaluators "
                    "(use {workspace}, {task_file}, {rollout_id}, {prompt}, {task[FIELD]}, {task[hidden.FIELD]})"
                )
        exe = self.config.command[0]
        if "{" in exe or ("/" in exe and not os.path.isabs(exe)):
            return  # rendered per rollout, or relative to the workspace: checked when it runs
        if shutil.which(exe) is None:
            raise ConfigError(f"evaluator.command[0]: executable {exe!r} not found on PATH")

    async def evaluate(self, inp: EvaluationInput) -> EvaluationResult:
        with tempfile.TemporaryDirectory(prefix="harnessrl-eval-") as tmp:  # 0700: the sandbox never sees it
            scratch = Path(tmp)
            # The full task (hidden fields included) for the scorer; the harness saw only its view.
            task_file = scratch / "task.json"
            task_file.write_text(json.dumps(inp.task))
            sandboxed = self.sandbox.mode != "none"
            workspace = (
                await asyncio.to_thread(self.sandbox.copy_workspace, inp.workspace, scratch)
                if sandboxed
                else inp.workspace
            )
            values = {
                "workspace": str(workspace),
                "task_file": str(task_file),
                "rollout_id": inp.rollout_id,
                "prompt": inp.task.get("prompt"),
                "task": inp.task,
            }
            command = [fill_placeholders(a, values) for a in self.config.command]
            env = scrubbed_env(scratch / "home")
            env.update(
                HARNESSRL_WORKSPACE=str(workspace),
                HARNESSRL_TASK_FILE=str(task_file),
                HARNESSRL_TASK=json.dumps(inp.task),
                HARNESSRL_ROLLOUT_ID=inp.rollout_id,
            )
            env.update({k: fill_placeholders(v, values) for k, v in self.config.env.items()})
            argv = self.sandbox.argv(
                command,
                workspace=workspace,
                original_workspace=inp.workspace,
                scratch=scratch,
                task=inp.task,
                task_file=task_file,
                env=env,
            )
            started = time.monotonic()
            code, out, err = await run_command(argv, workspace, {}, self.config.timeout_s, scratch)
        details = {
            "exit_code": code,
            "seconds": round(time.monotonic() - started, 3),
            "stdout_tail": out[-2000:],
            "stderr_tail": err[-2000:],
        }
        if code in self.config.infra_exit_codes:
            raise EvaluatorError(f"evaluator command could not run (exit {code}): {err[-500:].strip()}")
        if self.config.reward_from == "exit_code":
            return _checked(1.0 if code == 0 else 0.0, details)
        if code != 0:
            raise EvaluatorError(f"evaluator command exited with {code}: {err[-500:].strip()}")
        last = next((line.strip() for line in reversed(out.splitlines()) if line.strip()), "")
        if self.config.reward_from == "stdout_float":
            try:
                return _checked(float(last), details)
            except ValueError as exc:
                raise EvaluatorError(f"evaluator output's last line is not a number: {last[:200]!r}") from exc
        try:
            payload = json.loads(last)
        except ValueError as exc:
            raise EvaluatorError(f"evaluator output's last line is not JSON: {last[:200]!r}") from exc
        if not isinstance(payload, dict) or "reward" not in payload:
            raise EvaluatorError(f'evaluator JSON has no "reward": {last[:200]!r}')
        return _checked(payload.pop("reward"), {**details, "output": payload})


# ---------------------------------------------------------------------------------------------------
# python
# ---------------------------------------------------------------------------------------------------


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
        if isinstance(result, EvaluationResult):
            return _checked(result.reward, dict(result.details))
        if isinstance(result, Mapping) and "reward" in result:
            details = dict(result)
            return _checked(details.pop("reward"), details)
        return _checked(result, {})


# ---------------------------------------------------------------------------------------------------
# Answer extraction, reasoning_gym, exact_match
# ---------------------------------------------------------------------------------------------------


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
        return _checked(reward, {**details, "score": score})


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
