"""The ``[evaluator]`` section: one config class per evaluator kind, chosen by ``type``.

``EvaluatorConfig`` is the discriminated union of the four kinds; ``parse_evaluator_config`` turns
a config mapping into one of them, reporting every problem as a ``ConfigError`` that names
``evaluator.<field>``. Pure data, no evaluator code: each kind's module (``evaluators.command``,
``evaluators.python``, ``evaluators.answer``) imports its own config from here, and
``evaluators.build_evaluator`` maps a config to its evaluator.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import AnswerFallback
from harnessrl.tasks.fields import HIDDEN, get_field, is_hidden_path
from harnessrl.tasks.reasoning_gym_scorer import MAX_TIMEOUT_S as MAX_SCORER_TIMEOUT_S


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def check_task(self, task: Mapping[str, Any]) -> None:
        """Raise ``ConfigError`` naming the field when ``task`` lacks one this evaluator needs to score
        it: checked for every task before a run starts (``controller.harness.check_tasks``), so a
        missing gold answer is one clear error, not an infrastructure failure of every attempt.
        A few dictionary look-ups per task: cheap on a training set of 10^5."""


# ``{task[F]}`` and ``{prompt}`` in a command evaluator's command and env (``staging._PLACEHOLDER``).
_TASK_PLACEHOLDER = re.compile(r"\{(prompt|task\[([^\]\}]+)\])\}")


class EvaluatorLimits(_Config):
    """Caps of a command evaluator's sandbox: the scorer runs the agent's code, so it gets the same
    kind of limits as the harness (a cgroup per evaluation, ``RLIMIT_CPU``, a sized ``/tmp``, a cap
    on each file and on the disk its writable folders take)."""

    memory_mb: int | None = Field(default=2048, ge=16, description="cgroup memory cap (``/tmp`` counts)")
    max_processes: int | None = Field(default=256, ge=1, description="process-count cap (fork bombs)")
    cpu_seconds: int | None = Field(default=None, ge=1, description="RLIMIT_CPU of each process")
    tmp_mb: int = Field(default=512, ge=1, description="size of the private /tmp (a tmpfs)")
    file_mb: int | None = Field(
        default=1024, ge=1, description="largest file a process may write, RLIMIT_FSIZE (its output too)"
    )
    disk_mb: int | None = Field(
        default=4096,
        ge=1,
        description="disk the evaluation may add to what it starts with (the workspace copy, its "
        "folder, its output; each file or folder counts at least 4 KiB); past it the scorer is "
        "killed: reward 0, flag disk_limit_exceeded",
    )


# Fields of ``task["hidden"]`` that hold the solution itself, never what scoring needs: withheld from
# a command scorer's task file unless ``evaluator.withheld_fields`` says otherwise.
GOLD_FIELDS = ("patch", "gold_patch", "gold", "solution", "repo_path")


class CommandEvaluatorConfig(_Config):
    type: Literal["command"] = "command"
    command: list[str] = Field(
        min_length=1, description="argv; {workspace} {task_file} {rollout_id} {task[F]}"
    )
    timeout_s: float = Field(default=120.0, gt=0)
    reward_from: Literal["exit_code", "stdout_float", "json"] = "exit_code"
    reward_range: tuple[float, float] = Field(
        default=(0.0, 1.0),
        description="rewards outside [low, high] are refused: reward 0, flag reward_out_of_range",
    )
    env: dict[str, str] = Field(default_factory=dict)
    mounts: list[str] = Field(
        default_factory=list,
        description="more host paths the scorer may read (bound read-only at the same path); paths "
        "named in the command are copied in by themselves",
    )
    withheld_fields: list[str] = Field(
        default_factory=lambda: list(GOLD_FIELDS),
        description="fields of task.hidden left out of the scorer's task file (the solution itself)",
    )
    limits: EvaluatorLimits = Field(default_factory=EvaluatorLimits)
    max_workspace_mb: int = Field(
        default=2048, ge=1, description="data in the workspace copy; more ends the rollout with reward 0"
    )
    max_workspace_files: int = Field(
        default=200_000, ge=1, description="entries in the workspace copy; more ends it with reward 0"
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "infra_exit_codes" in data:
            raise ValueError(
                "infra_exit_codes was removed: an exit status is the scorer's (and so the scored code's) "
                "to choose; only the controller decides what is an infrastructure failure "
                "(docs/evaluators.md)"
            )
        return data

    def check_task(self, task: Mapping[str, Any]) -> None:
        """Every ``{task[F]}`` (and ``{prompt}``) the command and env name is in the task, not null:
        ``staging.fill_placeholders`` refuses a missing one at every evaluation."""
        templates = [(f"evaluator.command[{i}]", arg) for i, arg in enumerate(self.command)]
        templates += [(f"evaluator.env.{name}", value) for name, value in self.env.items()]
        for where, template in templates:
            for match in _TASK_PLACEHOLDER.finditer(template):
                path = match.group(2) or "prompt"
                try:
                    value = get_field(task, path)
                except KeyError:
                    value = None
                if value is None:
                    raise ConfigError(f"{where}: the task has no field {path!r} (used as {match.group(0)})")

    @model_validator(mode="after")
    def _range(self) -> CommandEvaluatorConfig:
        low, high = self.reward_range
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"reward_range must be two finite numbers, low <= high, not {self.reward_range}")
        return self


class PythonEvaluatorConfig(_Config):
    type: Literal["python"] = "python"
    function: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="package.module:function")
    timeout_s: float = Field(default=60.0, gt=0)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra keyword arguments")

    def check_task(self, task: Mapping[str, Any]) -> None:
        """What a function needs of a task cannot be known from its name: only a function that declares
        it is checked, by a ``check_task`` attribute of its own (``fn.check_task = callable(task,
        **kwargs)`` raising ``ConfigError``, or ``None`` when the task is fine), looked up once. A
        function that does not import is left to ``validate()``, which names ``evaluator.function``."""
        check = _declared_check(self.function)
        if check is not None:
            check(task, **self.kwargs)


@functools.lru_cache(maxsize=64)
def _declared_check(function: str) -> Callable[..., None] | None:
    """The ``check_task`` attribute of ``function`` (``package.module:name``), looked up once per
    process: ``check_tasks`` asks for every task, and a module that does not import would otherwise
    be searched for on ``sys.path`` 10^5 times."""
    module_name, _, attr = function.partition(":")
    try:
        target: Any = importlib.import_module(module_name)  # from sys.modules once validate() ran
    except Exception:  # noqa: BLE001  (validate() names it as evaluator.function)
        return None
    for part in attr.split("."):
        target = getattr(target, part, None)
    check = getattr(target, "check_task", None)
    return check if callable(check) else None


class ReasoningGymEvaluatorConfig(_Config):
    type: Literal["reasoning_gym"] = "reasoning_gym"
    answer_pattern: str = r"Answer:\s*(.+)"
    fallback: AnswerFallback = "last_line"
    strict: bool = True
    source: Literal["final_answer", "stdout"] = "final_answer"
    dataset: str | None = Field(default=None, description="used when the task has no 'dataset' field")
    timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=MAX_SCORER_TIMEOUT_S,
        allow_inf_nan=False,
        description="per answer: wall clock and CPU of its scorer (at most a day)",
    )
    memory_mb: int = Field(
        default=512, ge=16, description="address space a scorer child may add to its parent's (RLIMIT_AS)"
    )
    isolation: Literal["required", "available"] = Field(
        default="required",
        description="required: refuse to score where Landlock or libseccomp is missing; available: "
        "score with what the machine has, flagging weak_isolation (unsafe for training)",
    )

    def check_task(self, task: Mapping[str, Any]) -> None:
        """A dataset to score with (the task's ``dataset``, its ``hidden.metadata.source_dataset``, or
        ``evaluator.dataset``) and an entry to score against (``hidden.seed`` and ``hidden.index`` to
        regenerate it, or ``hidden.answer``), as ``tasks.reasoning_gym.scoring_entry`` reads them."""
        hidden = task.get(HIDDEN)
        hidden = hidden if isinstance(hidden, Mapping) else {}
        metadata = hidden.get("metadata")
        source = metadata.get("source_dataset") if isinstance(metadata, Mapping) else None
        if not (task.get("dataset") or source or self.dataset):
            raise ConfigError(
                "evaluator: the task has no field 'dataset' (nor hidden.metadata.source_dataset), and "
                "evaluator.dataset is not set: no reasoning-gym dataset to score it with"
            )
        regenerable = hidden.get("seed") is not None and hidden.get("index") is not None
        if not regenerable and "answer" not in hidden:
            raise ConfigError(
                f"evaluator: the task has no field '{HIDDEN}.answer' (nor {HIDDEN}.seed and "
                f"{HIDDEN}.index to regenerate its entry): nothing to score the answer against"
            )


class ExactMatchEvaluatorConfig(_Config):
    type: Literal["exact_match"] = "exact_match"
    field: str = Field(default=f"{HIDDEN}.answer", description="dotted path of the gold answer, under hidden")
    pattern: str | None = None
    fallback: AnswerFallback = "none"
    normalize: bool = True
    source: Literal["final_answer", "stdout"] = "final_answer"

    def check_task(self, task: Mapping[str, Any]) -> None:
        """The gold answer (``field``) is in the task, not null (``None`` would match "None"). A
        ``field`` outside ``hidden`` is the config's error, which the evaluator itself names."""
        if not is_hidden_path(self.field):
            return
        try:
            gold = get_field(task, self.field)
        except KeyError:
            gold = None
        if gold is None:
            raise ConfigError(
                f"evaluator.field: the task has no field {self.field!r} (the gold answer exact_match "
                "compares with)"
            )


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
