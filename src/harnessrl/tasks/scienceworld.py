"""ScienceWorld as a task source, and the replay evaluator that scores a played episode.

ScienceWorld (``pip install scienceworld``, a Scala simulator driven from Python through py4j; it
needs Java 17) is a text world of 30 science tasks, each with hundreds of *variations* split by the
environment itself into train / dev / test sets. A harnessrl task is one (task name, variation):

    data = {"prompt", "question", "task_name", "variation", "variations" (train|dev|test),
            "simplifications", "max_steps"}

**Who computes the reward.** The agent plays the episode inside its sandbox (the sandbox can reach
only the gateway, so the environment has to run there) and writes the actions it sent, in order, to
``scienceworld_actions.json`` in its workspace. The agent's own view of the score is never trusted:
:func:`replay_reward` (a ``python`` evaluator, run by the controller outside the sandbox) loads the
task's variation in a *fresh* environment, replays the logged actions, and reads the score from the
simulator: reward = ``max(score, 0) / 100``. ScienceWorld is deterministic for a given task,
variation and action sequence, so the replay reaches the state the agent reached. It also checks
that every logged action occurs, in order, in the text the policy sampled (the recorded calls: reply
text or tool-call arguments), so a harness cannot report actions the policy never chose; a log that
fails that check scores 0. A missing or malformed log is the policy's 0 too, flagged, never an error.

**Cost.** Each environment is a JVM (1-10 s to start on a busy 2-core machine, ~200-400 MB). The
evaluator keeps a small pool of them in worker threads of its own (``POOL_SIZE``) and reuses them
across rollouts: a replay is one ``load`` (0.1-1 s) plus ~20 ms per action. Steps go through
``env.server.step`` rather than ``env.step``: the latter also lists every valid action-object
combination after each step (~1 s on CPU), which a replay does not need; the state change is the
same (the extra calls are ScienceWorld's "free" actions that consume no time).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import random
import re
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError
from harnessrl.schemas import Call, Task
from harnessrl.tasks.agent_files import NotARegularFile, read_agent_file
from harnessrl.tasks.answers import sampled_text

ACTION_LOG = "scienceworld_actions.json"  # written by the agent in its workspace (its working directory)
SPLITS = ("train", "dev", "test")
DEFAULT_MAX_STEPS = 10
POOL_SIZE = 2  # JVMs the evaluator keeps; a replay takes about a second, so two keep up with a CPU run


def check_installed() -> None:
    """Raise ``ConfigError`` unless the ``scienceworld`` package and a ``java`` executable are present."""
    try:
        import scienceworld  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "scienceworld is not installed: `.venv/bin/pip install scienceworld` (it also needs Java 17)"
        ) from exc
    if shutil.which("java") is None:
        raise ConfigError("scienceworld needs Java 17 on PATH (`apt-get install openjdk-17-jre-headless`)")


# ---------------------------------------------------------------------------------------------------
# Environments: a few JVMs in worker threads of our own
# ---------------------------------------------------------------------------------------------------


class _EnvPool:
    """``POOL_SIZE`` worker threads, each owning one ``ScienceWorldEnv`` (started on first use).

    Replays run in these threads, never in asyncio's default executor: the controller and trainer
    use that one for store calls, and a queue of replays waiting for a JVM must not starve them.
    """

    def __init__(self, size: int):
        self._size = size
        self._executor: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._envs: list[Any] = []
        self._lock = threading.Lock()

    def _executor_(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._size, thread_name_prefix="scienceworld")
            return self._executor

    def _env(self) -> Any:
        env = getattr(self._local, "env", None)
        if env is None:
            from scienceworld import ScienceWorldEnv  # imported here: only runs that use it need it

            env = ScienceWorldEnv("")
            self._local.env = env
            with self._lock:
                self._envs.append(env)
        return env

    def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._env(), *args)
        except ConfigError:  # our own check of the arguments: the environment is fine
            raise
        except Exception:
            # py4j errors can leave the JVM dead or mid-episode: the next use in this thread starts a
            # fresh one rather than trusting it.
            self._drop()
            raise

    def _drop(self) -> None:
        env = getattr(self._local, "env", None)
        self._local.env = None
        if env is not None:
            with self._lock:
                self._envs.remove(env)
            with contextlib.suppress(Exception):  # already dead: nothing left to close
                env.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(env, *args)`` in a pool thread and wait (for synchronous callers)."""
        return self._executor_().submit(self._run, fn, *args).result()

    async def acall(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(env, *args)`` in a pool thread without blocking the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._executor_(), self._run, fn, *args)

    def close(self) -> None:
        with self._lock:
            envs, self._envs = self._envs, []
            executor, self._executor = self._executor, None
        for env in envs:
            with contextlib.suppress(Exception):  # the JVM is gone already
                env.close()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


_POOL = _EnvPool(POOL_SIZE)
atexit.register(_POOL.close)


# ---------------------------------------------------------------------------------------------------
# Episodes: the one definition of "start" and "step" that the agent's play and the replay share
# ---------------------------------------------------------------------------------------------------


def start_episode(env: Any, task_name: str, variation: int, simplifications: str = "") -> str:
    """Load the variation and return the first observation (what ``env.reset()`` gives the agent)."""
    env.load(task_name, variation, simplifications)
    observation, _info = env.reset()
    return observation


def step_episode(env: Any, action: str) -> tuple[str, int, bool]:
    """One action: (observation, score 0..100 or negative on failure, episode over)."""
    observation = env.server.step(action)
    score = int(round(100 * env.server.getScore()))
    # As ScienceWorldEnv.step: a negative score (a wrong focus) also ends the episode.
    return observation, score, bool(env.server.getCompleted()) or score < 0


@dataclass(frozen=True)
class ReplayResult:
    score: int  # the simulator's score after the last replayed action (0..100; negative = failed)
    completed: bool  # the task ended (solved or failed) within the replayed actions
    steps: int  # actions replayed (actions after the episode ended, or past max_steps, are not)
    last_observation: str


def _replay(
    env: Any, task_name: str, variation: int, simplifications: str, actions: list[str]
) -> ReplayResult:
    observation = start_episode(env, task_name, variation, simplifications)
    # The starting state can already score (with `openDoors`, "the door is open" is a subgoal met).
    score, completed, steps = int(round(100 * env.server.getScore())), False, 0
    for action in actions:
        observation, score, completed = step_episode(env, action)
        steps += 1
        if completed:
            break
    return ReplayResult(score=score, completed=completed, steps=steps, last_observation=observation)


def replay(
    task_name: str,
    variation: int,
    actions: Sequence[str],
    *,
    simplifications: str = "",
    max_steps: int | None = None,
) -> ReplayResult:
    """Play ``actions`` in a freshly loaded variation and return the simulator's verdict."""
    check_installed()
    actions = [str(a) for a in actions][: max_steps if max_steps is not None else None]
    return _POOL.call(_replay, task_name, int(variation), simplifications, actions)


async def areplay(
    task_name: str,
    variation: int,
    actions: Sequence[str],
    *,
    simplifications: str = "",
    max_steps: int | None = None,
) -> ReplayResult:
    """:func:`replay` for async callers (the evaluator)."""
    actions = [str(a) for a in actions][: max_steps if max_steps is not None else None]
    return await _POOL.acall(_replay, task_name, int(variation), simplifications, actions)


def gold_actions(task_name: str, variation: int, simplifications: str = "") -> list[str]:
    """A solution from the simulator's gold-path generator (for tests and for checking a setup).

    Not unique: where several objects qualify ("a non-living thing") it picks one at random."""
    check_installed()

    def gold(env: Any) -> list[str]:
        env.load(task_name, int(variation), simplifications, generateGoldPath=True)
        return [str(a) for a in env.get_gold_action_sequence()]

    return _POOL.call(gold)


# ---------------------------------------------------------------------------------------------------
# Task source
# ---------------------------------------------------------------------------------------------------


def task_id_for(task_name: str, variation: int, simplifications: str = "") -> str:
    """Deterministic: ``sw-boil-v3`` (``sw-boil-easy-v3`` with simplifications)."""
    simple = "-" + simplifications.replace(",", "+") if simplifications else ""
    return f"sw-{task_name}{simple}-v{variation}"


def scienceworld_tasks(
    tasks: Iterable[str],
    *,
    variations: str = "train",
    size: int | None = None,
    seed: int = 0,
    simplifications: str = "",
    max_steps: int = DEFAULT_MAX_STEPS,
    split: str = "train",
) -> list[Task]:
    """One harnessrl task per (ScienceWorld task, variation) in the environment's ``variations`` set.

    ``variations`` is ScienceWorld's own split (``train``, ``dev`` or ``test``), so a run trained on
    ``train`` variations and evaluated on ``dev`` ones never sees an evaluation variation in training.
    ``size`` keeps at most that many variations per task, drawn with ``seed`` (sorted, so the list is
    stable). ``split`` is the harnessrl split recorded on each task. Each variation is loaded once to
    read its task description (the prompt), about 0.1-1 s each.
    """
    check_installed()
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise ConfigError("scienceworld: `tasks` must name at least one ScienceWorld task")
    if variations not in SPLITS:
        raise ConfigError(f"scienceworld: variations must be one of {SPLITS}, got {variations!r}")
    if size is not None and size < 1:
        raise ConfigError(f"scienceworld: size must be >= 1, got {size}")
    if max_steps < 1:
        raise ConfigError(f"scienceworld: max_steps must be >= 1, got {max_steps}")

    def enumerate_(env: Any) -> list[Task]:
        known = set(env.get_task_names())
        possible = {"easy", *env.get_possible_simplifications()}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ConfigError(f"scienceworld: unknown task(s) {unknown}; known: {sorted(known)}")
        bad = [s for s in simplifications.split(",") if s and s not in possible]
        if bad:
            raise ConfigError(f"scienceworld: unknown simplification(s) {bad}; known: {sorted(possible)}")
        out = []
        for name in names:
            env.load(name, 0, simplifications)
            pool = [int(v) for v in getattr(env, f"get_variations_{variations}")()]
            if size is not None and size < len(pool):
                pool = sorted(random.Random(f"{seed}:{name}").sample(pool, size))
            for variation in pool:
                env.load(name, variation, simplifications)
                description = str(env.get_task_description()).strip()
                data = {
                    "prompt": description,
                    # Many variations share a description but not a world (objects, rooms, layout):
                    # the variation is what identifies the episode, e.g. for the trainer's check that
                    # held-out tasks are not training tasks, which compares `question`s.
                    "question": f"[{name} variation {variation}{' ' + simplifications if simplifications else ''}] "
                    + description,
                    "task_name": name,
                    "variation": variation,
                    "variations": variations,
                    "simplifications": simplifications,
                    "max_steps": max_steps,
                }
                out.append(
                    Task(task_id=task_id_for(name, variation, simplifications), split=split, data=data)
                )
        return out

    return _POOL.call(enumerate_)


# ---------------------------------------------------------------------------------------------------
# Evaluator
# ---------------------------------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


class ActionLogError(ValueError):
    """The agent's action log is missing, unreadable or malformed. ``flag`` says which
    (``action_log_missing`` / ``action_log_invalid``); :func:`replay_reward` scores it 0 with that
    flag, never raises it: the log is the agent's to write, so a bad one is the policy's 0."""

    def __init__(self, flag: str, message: str):
        super().__init__(message)
        self.flag = flag


def unverified_actions(actions: Sequence[str], calls: Sequence[Call]) -> list[str]:
    """Logged actions that do not occur, in order, in the text the policy sampled.

    Action ``i`` must be a substring (case and whitespace normalized) of some call's reply after the
    call that matched action ``i-1``: the agent may skip a reply (nothing parsable) but cannot invent
    or reorder actions. A reply is its text and its tool calls' arguments (``sampled_text``), so a
    harness that sends actions as function calls verifies as one that parses them from text.
    Returns the first offending action onward (empty: all verified).
    """
    texts = [_norm(sampled_text(c.response)) for c in sorted(calls, key=lambda c: (c.attempt, c.seq))]
    position = 0
    for index, action in enumerate(actions):
        wanted = _norm(action)
        while position < len(texts) and wanted not in texts[position]:
            position += 1
        if position == len(texts):
            return list(actions[index:])
        position += 1
    return []


_MAX_LOG_BYTES = 1 << 20  # tens of thousands of actions, far past any max_steps: bigger is invalid


def _read_log_bytes(path: Path) -> bytes:
    """The log's bytes, read as any file of the hostile workspace is (``agent_files``: no links, a
    regular file only, at most ``_MAX_LOG_BYTES``). Any failure is an ``ActionLogError``."""
    name = path.name
    try:
        data = read_agent_file(path, _MAX_LOG_BYTES + 1)
    except FileNotFoundError as exc:
        raise ActionLogError(
            "action_log_missing", f"scienceworld: the agent left no action log ({name}) in its workspace"
        ) from exc
    except NotARegularFile as exc:
        raise ActionLogError("action_log_invalid", f"scienceworld: {name} is not a regular file") from exc
    except OSError as exc:  # ELOOP: a link; EACCES, a failed read, ...
        raise ActionLogError("action_log_invalid", f"scienceworld: cannot read {name}: {exc}") from exc
    if len(data) > _MAX_LOG_BYTES:
        raise ActionLogError("action_log_invalid", f"scienceworld: {name} is over {_MAX_LOG_BYTES} bytes")
    return data


def _parse_action_log(workspace: Path, name: str) -> tuple[list[str], Any]:
    """(actions, the score the agent claimed or None) from one read of the log."""
    raw = _read_log_bytes(Path(workspace) / name)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: [[[[...]]]]
        raise ActionLogError("action_log_invalid", f"scienceworld: {name} is not JSON: {exc}") from exc
    actions = data.get("actions") if isinstance(data, dict) else None
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        raise ActionLogError(
            "action_log_invalid", f"scienceworld: {name} must be an object with a list of strings 'actions'"
        )
    if not all(_utf8(a) for a in actions):
        # JSON's "\ud800" is a lone surrogate, which the simulator's bridge (py4j) cannot send: the
        # replay raised, an infrastructure failure the policy chose (its tool call's JSON arguments
        # can hold the same escape, so the check against its replies passed).
        raise ActionLogError(
            "action_log_invalid", f"scienceworld: {name} holds an action with a lone surrogate"
        )
    return actions, data.get("score")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_action_log(workspace: Path, name: str = ACTION_LOG) -> list[str]:
    """The agent's action log (``{"actions": [...], ...}``); ``ActionLogError`` (with its ``flag``)
    if missing, not a regular file reached without links, over 1 MiB, or malformed. Blocking I/O:
    async callers run it in a thread."""
    return _parse_action_log(workspace, name)[0]


async def replay_reward(
    inp: Any, *, action_log: str = ACTION_LOG, verify_calls: bool = True
) -> dict[str, Any]:
    """The ``python`` evaluator: replay the agent's logged actions in a fresh environment.

    ``[evaluator] type = "python"``, ``function = "harnessrl.tasks.scienceworld:replay_reward"``.
    Task, variation, simplifications and the step budget come from the task, never from the log.
    ``inp`` is the controller's ``EvaluationInput``. Returns ``{"reward": max(score, 0) / 100, ...}``;
    the other keys (raw score, replayed actions, the score the agent claimed: a mismatch would mean
    the simulator was not deterministic) become the evaluation's ``details``.

    The action log is the agent's: a missing, unreadable or malformed one (a directory, a FIFO, a
    link, not JSON, actions that are not strings) scores 0 with ``flags`` ``["action_log_missing"]``
    or ``["action_log_invalid"]``, never an exception: an exception is an infrastructure failure,
    retried and left out of the baseline, so an agent could turn its 0 into "not counted". Only a
    task without ``task_name``/``variation`` raises (the task's fault, not the policy's).
    """
    task = inp.task
    if "task_name" not in task or "variation" not in task:
        raise ValueError("scienceworld: the task has no 'task_name'/'variation' (use scienceworld_tasks)")
    try:
        # In a thread: the controller's event loop must never wait on the agent's files.
        actions, claimed = await asyncio.to_thread(_parse_action_log, Path(inp.workspace), action_log)
    except ActionLogError as exc:
        return {"reward": 0.0, "flags": [exc.flag], "error": str(exc)}
    max_steps = int(task.get("max_steps") or DEFAULT_MAX_STEPS)
    played = actions[:max_steps]
    details: dict[str, Any] = {"actions": played, "logged_actions": len(actions)}
    if verify_calls:
        forged = unverified_actions(played, inp.calls)
        if forged:
            details["unverified_actions"] = forged[:5]
            return {"reward": 0.0, **details}
    result = await areplay(
        str(task["task_name"]),
        int(task["variation"]),
        played,
        simplifications=str(task.get("simplifications", "")),
    )
    details.update(score=result.score, completed=result.completed, steps=result.steps, agent_score=claimed)
    return {"reward": max(result.score, 0) / 100.0, **details}


def _check_replay_task(task: Mapping[str, Any], **kwargs: Any) -> None:
    """What ``replay_reward`` needs, checked for every task before a run starts
    (``PythonEvaluatorConfig.check_task``): a ``task_name`` and an integer ``variation``. Without it
    such a task was an infrastructure failure at every attempt."""
    if "task_name" not in task or "variation" not in task:
        raise ConfigError("the task has no 'task_name'/'variation' (use scienceworld_tasks)")
    try:
        int(task["variation"])  # as replay_reward reads it
    except (TypeError, ValueError):
        raise ConfigError(f"the task's 'variation' must be an integer, got {task['variation']!r}") from None


replay_reward.check_task = _check_replay_task  # type: ignore[attr-defined]
