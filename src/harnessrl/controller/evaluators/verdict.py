"""The verdict of a ``command`` scorer's run: its reward, or 0 with a flag naming why there is none.

``scorer_verdict`` reads a finished ``ScorerRun`` as ``reward_from`` says (the exit code, the last
stdout line as a float, or the last stdout line as JSON ``{"reward": x, "flags": [...], ...}``).
Everything here is the policy's outcome, never an infrastructure failure: the agent's code can make
the scorer exit non-zero, print garbage, nest its JSON past ``MAX_VERDICT_DEPTH``, run out of time,
or (for a scorer program in the workspace) be deleted, so each gives reward 0 (the low end of a
``reward_range`` below 0: ``config.failure_reward``) with a flag
(``scorer_failed``, ``scorer_timeout``, ``scorer_missing``), and so does one that wrote past the
evaluation's disk caps (``disk_limit_exceeded``; ``file_size_limit_exceeded`` when the scorer was
killed by ``SIGXFSZ``). A reward outside ``reward_range`` is refused (reward 0, ``reward_out_of_range``). ``evaluators.command`` runs the scorer and hands the run
here. See docs/evaluators.md.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import dataclass
from typing import Any

from harnessrl.controller.evaluators.config import CommandEvaluatorConfig
from harnessrl.controller.evaluators.types import EvaluationResult, scorer_flags

# Flags a command evaluator records with the rollout when its scorer gave no valid verdict.
SCORER_FAILED = "scorer_failed"  # the scorer ran but gave no valid verdict (exit status, output, killed)
SCORER_TIMEOUT = "scorer_timeout"  # the scorer ran past timeout_s
SCORER_MISSING = "scorer_missing"  # its program, in the workspace, was gone or not executable
REWARD_OUT_OF_RANGE = "reward_out_of_range"  # a verdict outside reward_range
DISK_LIMIT_EXCEEDED = "disk_limit_exceeded"  # its folders grew past limits.disk_mb: killed, not scored
FILE_SIZE_LIMIT_EXCEEDED = "file_size_limit_exceeded"  # the scorer died of SIGXFSZ (limits.file_mb)

# A JSON verdict nested deeper than this is no verdict: it is stored with the rollout (details), and
# whoever serialises it later (the store, the dashboard) would hit Python's recursion limit.
MAX_VERDICT_DEPTH = 32


@dataclass
class ScorerRun:
    code: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float
    oom: bool = False
    # The launcher's report when the scorer's program, a file in the workspace, could not be started.
    missing: str | None = None
    # Why the evaluation's folders were over ``limits.disk_mb`` (the scorer was killed, or exited, so).
    disk_limit: str | None = None


def scorer_verdict(run: ScorerRun, config: CommandEvaluatorConfig) -> EvaluationResult:
    """The reward the scorer's run gives, or 0 with a flag when it gave no valid verdict."""
    details: dict[str, Any] = {
        "exit_code": run.code,
        "seconds": run.seconds,
        "stdout_tail": run.stdout[-2000:],
        "stderr_tail": run.stderr[-2000:],
    }
    if run.missing is not None:
        why = f"its program, in the workspace, could not be started: {run.missing[:500]}"
        return EvaluationResult(config.failure_reward, {**details, "why": why}, (SCORER_MISSING,))
    if run.disk_limit is not None:
        return EvaluationResult(
            config.failure_reward, {**details, "why": run.disk_limit}, (DISK_LIMIT_EXCEEDED,)
        )
    if run.code == 128 + signal.SIGXFSZ and config.limits.file_mb:
        why = f"the scorer was killed writing a file past limits.file_mb = {config.limits.file_mb} MiB"
        return EvaluationResult(config.failure_reward, {**details, "why": why}, (FILE_SIZE_LIMIT_EXCEEDED,))
    if run.code is None:
        return EvaluationResult(
            config.failure_reward,
            {**details, "why": f"timed out after {config.timeout_s:g} s"},
            (SCORER_TIMEOUT,),
        )
    if run.oom:
        details["oom_killed"] = True
    if config.reward_from == "exit_code":
        return _in_range(1.0 if run.code == 0 else 0.0, details, (), config)
    if run.code != 0:
        return _failed(details, f"the scorer exited with {run.code}", config)
    # Lines end at "\n" only, as the scorer printed them: ``str.splitlines`` also splits at U+2028,
    # U+0085 and other separators that a JSON verdict printed with ``ensure_ascii=False`` holds raw.
    last = next((line.strip() for line in reversed(run.stdout.split("\n")) if line.strip()), "")
    if config.reward_from == "stdout_float":
        try:
            reward = float(last)
        except ValueError:
            return _failed(details, f"its output's last line is not a number: {last[:200]!r}", config)
        return _in_range(reward, details, (), config)
    try:
        payload = json.loads(last)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return _failed(details, f"its output's last line is not JSON: {last[:200]!r}", config)
    if not isinstance(payload, dict) or "reward" not in payload:
        return _failed(details, f'its JSON has no "reward": {last[:200]!r}', config)
    if _depth(payload) > MAX_VERDICT_DEPTH:
        return _failed(
            details, f"its JSON nests deeper than {MAX_VERDICT_DEPTH} levels: {last[:200]!r}", config
        )
    reward = payload.pop("reward")
    flags = scorer_flags(payload.get("flags"))
    return _in_range(reward, {**details, "output": payload}, flags, config)


def _in_range(
    reward: Any, details: dict[str, Any], flags: tuple[str, ...], config: CommandEvaluatorConfig
) -> EvaluationResult:
    if not isinstance(reward, bool | int | float) or (
        isinstance(reward, float) and not math.isfinite(reward)
    ):
        return _failed(details, f"its reward is not a finite number: {repr(reward)[:200]}", config, flags)
    low, high = config.reward_range
    # Compared as it is: Python compares an int of any size with a float exactly, where float()
    # of a JSON integer past ~1e308 raises OverflowError. Such a reward is outside any range.
    if not low <= reward <= high:
        why = f"reward {repr(reward)[:200]} outside reward_range [{low:g}, {high:g}]"
        return EvaluationResult(config.failure_reward, {**details, "why": why}, (*flags, REWARD_OUT_OF_RANGE))
    return EvaluationResult(float(reward), details, flags)


def _failed(
    details: dict[str, Any], why: str, config: CommandEvaluatorConfig, flags: tuple[str, ...] = ()
) -> EvaluationResult:
    return EvaluationResult(config.failure_reward, {**details, "why": why}, (*flags, SCORER_FAILED))


def _depth(value: Any) -> int:
    """How deeply parsed JSON nests objects and lists (``{}`` is 1); iterative, so any depth."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
