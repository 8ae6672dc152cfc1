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

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from harnessrl.errors import ConfigError
from harnessrl.tasks.answers import AnswerFallback, blank_answer
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
    # Finite: ``inf`` waited forever on a scorer that never exits (the rollout, and its slot, held).
    timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
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
                if where.startswith("evaluator.command") and is_hidden_path(path) and not _a_path(value):
                    raise ConfigError(
                        f"{where}: {match.group(0)} puts hidden data on the scorer's command line (a "
                        "value, not an absolute path: only those are copied in and named by their copy), "
                        "which the code it scores can read (/proc/<pid>/cmdline is readable to every "
                        "process in the sandbox); pass it through evaluator.env (GOLD = "
                        f'"{match.group(0)}": the scorer\'s environment is closed to that code) or '
                        "read it from the task file ($HARNESSRL_TASK_FILE)"
                    )
        scorer = _task_reading_scorer(self.command)
        if scorer is not None:
            # It reads the task file itself: the test lists it needs, as it will see them (the task
            # without withheld_fields). Without this a task lacking hidden.FAIL_TO_PASS made the
            # scorer exit 2 at every attempt: reward 0 flagged scorer_failed, the policy's, the run
            # going on (exit 0) training on it.
            from harnessrl.tasks.pytest_scoring import ScoringError, test_lists

            hidden = task.get(HIDDEN)
            if isinstance(hidden, Mapping):
                task = {**task, HIDDEN: {k: v for k, v in hidden.items() if k not in self.withheld_fields}}
            try:
                test_lists(dict(task))
            except ScoringError as exc:
                raise ConfigError(f"evaluator.command ({scorer}): {exc}") from None

    @field_validator("command")
    @classmethod
    def _command(cls, command: list[str]) -> list[str]:
        for i, arg in enumerate(command):
            if "\0" in arg:
                raise ValueError(f"command[{i}] holds a NUL byte, which no argument can hold")
        return command

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        # Accepted here, these failed every evaluation as "the scorer did not start" (an
        # infrastructure failure, retried, the task never trained) or a ConfigError mid-run.
        for name, value in env.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(
                    f"{name!r} is no environment variable name (empty, or holding '=' or a NUL byte)"
                )
            if "\0" in value:
                raise ValueError(f"{name} holds a NUL byte, which no environment variable can hold")
        return env

    @property
    def failure_reward(self) -> float:
        """What a scorer that gave no valid verdict earns (its flag says why): 0, or the lowest reward
        of ``reward_range`` when that is below 0. A 0 above the range's low end paid the agent for
        breaking the scorer (a crash, a timeout, a verdict out of range) more than for failing its
        tests honestly."""
        return min(0.0, self.reward_range[0])

    @model_validator(mode="after")
    def _range(self) -> CommandEvaluatorConfig:
        low, high = self.reward_range
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"reward_range must be two finite numbers, low <= high, not {self.reward_range}")
        return self


def _a_path(value: Any) -> bool:
    """Whether a hidden value a command argument names is a path (``hidden.tests``): its folder is
    copied in and the argument names the copy, so the command line holds no hidden data."""
    return isinstance(value, str) and value.startswith("/") and "\n" not in value


# harnessrl's scorers that read the task file themselves and need its test lists (``pytest_scoring
# .test_lists``): the module ``python -m`` runs, and the subcommand that does it (None: any).
_TEST_LIST_SCORERS = {"harnessrl.tasks.pytest_scoring": None, "harnessrl.tasks.coding": "evaluate"}
_PYTHON = re.compile(r"^python[\d.]*$")
_PYTHON_FLAGS = frozenset("bBdEhiIOPqsSuvV")  # python's short options that take no value
# Options of those scorers that take a value; any other word after the module is a task file.
_SCORER_VALUE_OPTIONS = frozenset({"--hidden", "--files", "--config", "--timeout", "--python"})


def _task_reading_scorer(command: list[str]) -> str | None:
    """``python -m harnessrl.tasks.pytest_scoring ...`` (or ``harnessrl.tasks.coding evaluate``)
    reading the evaluator's own task file ($HARNESSRL_TASK_FILE, or ``{task_file}``): the module's
    name, else None. A command that names another task file, or runs anything else, is not known."""
    if not command or not _PYTHON.match(command[0].rsplit("/", 1)[-1]):
        return None
    args, module = iter(command[1:]), None
    for arg in args:
        if not arg.startswith("-") or arg.startswith("--"):
            return None  # a script, or a long option before -m: not what we know
        flags = arg[1:]
        where = flags.find("m")
        if where < 0:
            if not set(flags) <= _PYTHON_FLAGS:
                return None  # -c CODE, -X/-W VALUE: not one of our scorers
            continue
        if not set(flags[:where]) <= _PYTHON_FLAGS:
            return None
        module = flags[where + 1 :] or next(args, None)
        break
    if module not in _TEST_LIST_SCORERS:
        return None
    rest = list(args)
    subcommand = _TEST_LIST_SCORERS[module]
    if subcommand is not None:
        if not rest or rest[0] != subcommand:
            return None
        rest = rest[1:]
    index = 0
    while index < len(rest):
        arg = rest[index]
        if arg in _SCORER_VALUE_OPTIONS:
            index += 2
            continue
        if not arg.startswith("-") and arg != "{task_file}":
            return None  # a task file of its own: not the task checked here
        index += 1
    return module


class PythonEvaluatorConfig(_Config):
    type: Literal["python"] = "python"
    function: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="package.module:function")
    timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
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
    timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=MAX_SCORER_TIMEOUT_S,
        allow_inf_nan=False,
        description="per answer: wall clock of pattern over the policy's text, in a process of its own",
    )
    memory_mb: int = Field(
        default=512,
        ge=64,
        description="address space the pattern's process may add to its own (RLIMIT_AS): past it the "
        "answer earns 0, flagged pattern_raised",
    )

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
        golds = gold if isinstance(gold, list) else [gold]
        if any(g is None for g in golds):  # compared as the text "None"
            raise ConfigError(f"evaluator.field: the task's {self.field!r} holds a null gold answer")
        if all(blank_answer(str(g)) for g in golds):  # matches nothing (it paid for an empty reply)
            raise ConfigError(
                f"evaluator.field: the task's {self.field!r} has no answer that is not blank: nothing can match it"
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
