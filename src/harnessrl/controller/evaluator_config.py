"""The ``[evaluator]`` section: one config class per evaluator kind, chosen by ``type``.

``EvaluatorConfig`` is the discriminated union of the four kinds; ``parse_evaluator_config`` turns
a config mapping into one of them, reporting every problem as a ``ConfigError`` that names
``evaluator.<field>``. Pure data, no evaluator code: each kind's module (``evaluator_command``,
``evaluator_python``, ``evaluator_answer``) imports its own config from here, and
``evaluators.build_evaluator`` maps a config to its evaluator.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import AnswerFallback
from harnessrl.tasks.fields import HIDDEN


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
