"""Evaluators: real subprocesses for ``command``, real reasoning-gym datasets, config errors up front."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harnessrl.controller.evaluators import (
    CommandEvaluatorConfig,
    EvaluationInput,
    EvaluationResult,
    EvaluatorError,
    ReasoningGymEvaluator,
    build_evaluator,
    parse_evaluator_config,
)
from harnessrl.controller.evaluators.command import EvaluatorSandbox
from harnessrl.errors import ConfigError
from harnessrl.sandbox.host import SandboxHost
from harnessrl.schemas import Call
from harnessrl.tasks.answers import final_answer_text as calls_final_answer_text
from harnessrl.tasks.reasoning_gym import reasoning_gym_tasks

# -- functions the python evaluator imports (by this module's own name) ----------------------------


def score_sync(inp: EvaluationInput, bonus: float = 0.0) -> float:
    return (1.0 if "42" in inp.final_answer else 0.0) + bonus


async def score_async(inp: EvaluationInput) -> EvaluationResult:
    return EvaluationResult(0.5, {"workspace": str(inp.workspace)})


def score_dict(inp: EvaluationInput) -> dict:
    return {"reward": True, "why": "bool counts as 1"}


def score_crash(inp: EvaluationInput) -> float:
    raise RuntimeError("scorer bug")


def score_nan(inp: EvaluationInput) -> float:
    return math.nan


def score_huge(inp: EvaluationInput) -> int:
    return 10**400  # an int no float can hold (float() of it raises OverflowError)


def score_slow(inp: EvaluationInput) -> float:
    time.sleep(2)
    return 1.0


not_callable = 3

# -- helpers ----------------------------------------------------------------------------------------


def call(content, seq: int = 0) -> Call:
    return Call(
        rollout_id="r",
        seq=seq,
        response={"role": "assistant", "content": content},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )


def evaluate(config: dict, inp: EvaluationInput) -> EvaluationResult:
    return asyncio.run(build_evaluator(config).evaluate(inp))


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


def sh(script: str, **extra) -> dict:
    return {"type": "command", "command": ["sh", "-c", script], **extra}


# -- command ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "reward"), [(0, 1.0), (1, 0.0), (5, 0.0)])
def test_command_exit_code(ws, code, reward):
    result = evaluate(sh(f"exit {code}"), EvaluationInput(task={}, workspace=ws))
    assert result.reward == reward and result.details["exit_code"] == code


def test_command_runs_in_workspace_with_templates_and_clean_env(ws, monkeypatch):
    monkeypatch.setenv("HARNESSRL_ADMIN_KEY", "admin-secret")
    (ws / "marker").write_text("here")
    config = {
        "type": "command",
        "reward_from": "json",
        "env": {"GOLD": "{task[hidden.answer]}"},  # a dotted path into the full task
        "command": [
            sys.executable,
            "-c",
            "import json, os, sys; print(json.dumps({'reward': 1, 'cwd_ok': os.path.exists('marker'),"
            " 'argv': sys.argv[1:], 'gold': os.environ['GOLD'], 'task': json.load(open(sys.argv[2])),"
            " 'admin': os.environ.get('HARNESSRL_ADMIN_KEY'), 'rid': os.environ['HARNESSRL_ROLLOUT_ID'],"
            " 'env_task': os.environ.get('HARNESSRL_TASK')}))",
            "{workspace}",
            "{task_file}",
            "${HOME}",
        ],
    }
    task = {"prompt": "p", "hidden": {"answer": "7", "patch": "the gold fix", "repo_path": str(ws)}}
    result = evaluate(config, EvaluationInput(task=task, workspace=ws, rollout_id="r-9"))
    out = result.details["output"]
    assert result.reward == 1.0
    # It scores a copy of the workspace, bound at the workspace's own path (the test below shows
    # nothing it does touches the original); its task file is its own, inside its sandbox.
    assert out["cwd_ok"] and out["argv"] == [str(ws), "/run/harnessrl/task.json", "${HOME}"]
    assert out["gold"] == "7" and out["rid"] == "r-9"
    # The scorer's task holds what scoring needs, not the solution: no gold patch, no original repo.
    assert out["task"] == {"prompt": "p", "hidden": {"answer": "7"}}
    assert out["env_task"] is None  # not in the environment, which every child would inherit
    assert out["admin"] is None  # the controller's secrets never reach the scorer


def test_command_scores_a_copy_and_cannot_change_the_agents_workspace(ws):
    (ws / "answer.txt").write_text("42")
    result = evaluate(
        sh("cat answer.txt && echo scorer-was-here > answer.txt && rm -f missing"),
        EvaluationInput(task={}, workspace=ws),
    )
    assert result.reward == 1.0 and "42" in result.details["stdout_tail"]
    assert (ws / "answer.txt").read_text() == "42"


def test_command_env_is_scrubbed(ws, monkeypatch, tmp_path):
    # A sitecustomize.py the agent planted where the controller's PYTHONPATH points never runs.
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text("print('PLANTED')\n")
    monkeypatch.setenv("PYTHONPATH", str(planted))
    result = evaluate(
        sh('python -c \'import os; print(os.environ.get("PYTHONPATH"), os.environ["HOME"])\''),
        EvaluationInput(task={}, workspace=ws),
    )
    out = result.details["stdout_tail"]
    assert "PLANTED" not in out and out.startswith("None ")
    assert str(Path.home()) not in out.split()[1]


@pytest.mark.parametrize(
    ("script", "reward_from", "reward"),
    [
        ("echo noise; echo 0.25", "stdout_float", 0.25),
        ('echo \'{"reward": 0.75, "passed": 3}\'', "json", 0.75),
    ],
)
def test_command_parsed_output(ws, script, reward_from, reward):
    assert (
        evaluate(sh(script, reward_from=reward_from), EvaluationInput(task={}, workspace=ws)).reward == reward
    )


@pytest.mark.parametrize(
    ("script", "reward_from", "why"),
    [
        ("echo not-a-number", "stdout_float", "not a number"),
        ("echo nan", "stdout_float", "finite"),
        ("echo '{\"score\": 1}'", "json", 'no "reward"'),
        ("echo '[1]'", "json", 'no "reward"'),
        ("echo {", "json", "not JSON"),
        ("echo 1; exit 3", "stdout_float", "exited with 3"),
        ("echo '{\"reward\": 1}'; kill -9 $$", "json", "exited with 137"),
    ],
)
def test_a_scorer_without_a_valid_verdict_scores_zero_with_a_flag(ws, script, reward_from, why):
    # The agent's code runs inside the scorer and can make it crash, print garbage or kill it: that
    # is the policy's outcome (0), never an infrastructure failure that would be retried and left
    # out of its group's baseline.
    result = evaluate(sh(script, reward_from=reward_from), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.flags == ("scorer_failed",)
    assert why in result.details["why"]


@pytest.mark.parametrize(
    ("verdict", "why"),
    [
        ("[" * 100_000, "not JSON"),  # json.loads raised RecursionError: "evaluator crashed", retried
        ('{"reward": 1, "x": ' + "[" * 40 + "]" * 40 + "}", "nests deeper than 32"),
    ],
)
def test_a_verdict_nested_past_any_sensible_depth_scores_zero_with_a_flag(ws, verdict, why):
    """The last line may be the scored code's (a scorer that lets it print): a verdict too deep to
    parse, or to store with the rollout, is no verdict, not an evaluator crash."""
    (ws / "verdict.txt").write_text(verdict + "\n")
    result = evaluate(sh("cat verdict.txt", reward_from="json"), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.flags == ("scorer_failed",)
    assert why in result.details["why"]


@pytest.mark.parametrize("sign", ["", "-"])
def test_a_json_reward_past_the_float_range_is_out_of_range(ws, sign):
    # JSON integers have no size limit; float() of this one raised OverflowError ("evaluator crashed").
    (ws / "verdict.txt").write_text(f'{{"reward": {sign}1{"0" * 400}}}\n')
    result = evaluate(sh("cat verdict.txt", reward_from="json"), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.flags == ("reward_out_of_range",)
    assert "outside reward_range" in result.details["why"]


# -- a scorer program in the workspace: the policy's to break ----------------------------------------


def _run_tests_script(ws: Path) -> Path:
    script = ws / "run_tests.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("mode", ["bwrap", "none"])
@pytest.mark.parametrize("program", ["{workspace}/run_tests.sh", "./run_tests.sh"])
@pytest.mark.parametrize("damage", ["deleted", "not_executable", "a_folder"])
def test_a_scorer_program_the_policy_broke_in_its_workspace_scores_zero_with_a_flag(
    ws, mode, program, damage
):
    """The agent owns its workspace: deleting or ``chmod -x``-ing a scorer kept there turned its 0 into
    an infrastructure failure ("the scorer did not start"), retried and left out of the baseline."""
    evaluator = build_evaluator(
        {"type": "command", "command": [program]}, validate=False, sandbox=EvaluatorSandbox(mode)
    )
    script = _run_tests_script(ws)
    intact = asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=ws)))
    assert (intact.reward, intact.flags) == (1.0, ())  # the control: this is the program that scores
    if damage == "deleted":
        script.unlink()
    elif damage == "not_executable":
        script.chmod(0o644)
    else:
        script.unlink()
        script.mkdir()
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=ws)))
    assert (result.reward, result.flags) == (0.0, ("scorer_missing",))
    assert "could not be started" in result.details["why"]


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_scorer_program_outside_the_workspace_that_cannot_start_is_an_infrastructure_failure(
    ws, tmp_path, mode
):
    not_executable = tmp_path / "score.sh"
    not_executable.write_text("#!/bin/sh\nexit 0\n")
    not_executable.chmod(0o644)
    programs = [
        str(tmp_path / "scorers" / "run_tests.sh"),  # a scorer binary that is not there
        str(not_executable),
        "no-such-scorer-xyz",  # a bare name is a tool on PATH, never the workspace's
        "{workspace}/../scorers/run_tests.sh",  # names the workspace, resolves outside it
    ]
    for program in programs:
        evaluator = build_evaluator(
            {"type": "command", "command": [program]}, validate=False, sandbox=EvaluatorSandbox(mode)
        )
        with pytest.raises(EvaluatorError, match="the scorer did not start"):
            asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=ws)))


class _NoCgroupHost(SandboxHost):
    """A host whose launches cannot join their cgroup: the launcher's setup fails, as on a machine
    where the controller lost its cgroup delegation."""

    def launch_argv(self, spec_path: Path, **options) -> list[str]:
        return super().launch_argv(spec_path, **{**options, "cgroup_dirs": (Path("/nonexistent-cgroup"),)})


@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_launcher_that_failed_is_infrastructure_even_when_the_workspace_program_is_gone(ws, mode):
    # The program's absence does not make every "did not start" the policy's: only the launcher
    # reporting that the sandbox came up and the program's exec failed does.
    evaluator = build_evaluator(
        {"type": "command", "command": ["{workspace}/run_tests.sh"]},
        validate=False,
        sandbox=EvaluatorSandbox(mode, host=_NoCgroupHost()),
    )
    with pytest.raises(EvaluatorError, match="setup failed"):
        asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=ws)))


# Run in a mount namespace of its own, where the scorer's scratch folder is a noexec tmpfs.
_ON_NOEXEC_TMP = """
import asyncio, sys
from pathlib import Path
from harnessrl.controller.evaluators import EvaluationInput, EvaluatorError, build_evaluator
from harnessrl.controller.evaluators.command import EvaluatorSandbox
evaluator = build_evaluator({"type": "command", "command": ["{workspace}/run_tests.sh"]},
                            validate=False, sandbox=EvaluatorSandbox(sys.argv[2]))
try:
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=Path(sys.argv[1]))))
    print("scored", result.reward, result.flags)
except EvaluatorError as exc:
    print("evaluator error:", exc)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs in a mount namespace of its own")
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_workspace_program_on_a_noexec_mount_is_an_infrastructure_failure(tmp_path, mode):
    """A hardened host (``/tmp`` mounted noexec) starts no workspace program, whatever the policy did:
    that must stay an infrastructure failure, not a 0 for every rollout."""
    mount = tmp_path / "noexec"
    mount.mkdir()
    script = tmp_path / "run.py"
    script.write_text(_ON_NOEXEC_TMP)
    shell = (
        f"mount -t tmpfs -o noexec none {mount} && mkdir {mount}/ws"
        f" && printf '#!/bin/sh\\nexit 0\\n' > {mount}/ws/run_tests.sh && chmod 755 {mount}/ws/run_tests.sh"
        f" && TMPDIR={mount} {sys.executable} {script} {mount}/ws {mode}"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120)
    if "unshare" in done.stderr and done.returncode != 0:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()}")
    assert done.stdout.startswith("evaluator error: the scorer did not start"), done.stdout + done.stderr


@pytest.mark.parametrize("code", [125, 126, 127])
def test_exit_statuses_that_once_meant_could_not_run_are_the_scorers_outcome(ws, code):
    result = evaluate(sh(f"exit {code}"), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.details["exit_code"] == code


def test_infra_exit_codes_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="infra_exit_codes was removed"):
        build_evaluator({"type": "command", "command": ["sh"], "infra_exit_codes": [125]})


@pytest.mark.parametrize(
    ("verdict", "reward", "flags"),
    [
        ("0.5", 0.5, ()),
        ("1e300", 0.0, ("reward_out_of_range",)),
        ("-1", 0.0, ("reward_out_of_range",)),
        ("1.0000001", 0.0, ("reward_out_of_range",)),
    ],
)
def test_a_reward_outside_the_declared_range_is_refused(ws, verdict, reward, flags):
    result = evaluate(
        sh(f"echo {verdict}", reward_from="stdout_float"), EvaluationInput(task={}, workspace=ws)
    )
    assert (result.reward, result.flags) == (reward, flags)
    wide = evaluate(
        sh("echo 7", reward_from="stdout_float", reward_range=[0, 10]), EvaluationInput(task={}, workspace=ws)
    )
    assert (wide.reward, wide.flags) == (7.0, ())


def test_a_scorers_own_flags_are_kept_when_well_formed(ws):
    out = '{"reward": 0, "flags": ["verdict_disagreement", "Bad Flag!", 3, "verdict_disagreement"]}'
    result = evaluate(sh(f"echo '{out}'", reward_from="json"), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.flags == ("verdict_disagreement",)


def test_a_scorer_past_its_time_limit_scores_zero_and_leaves_nothing_running(ws):
    mark = f"61.{os.getpid()}{time.time_ns() % 10**6}"  # a sleep no other process on the machine runs
    result = evaluate(sh(f"sleep {mark} & wait", timeout_s=1.5), EvaluationInput(task={}, workspace=ws))
    assert result.reward == 0.0 and result.flags == ("scorer_timeout",)
    found = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
    assert not found.stdout.strip(), "the evaluator's child survived its timeout"


def test_command_leftover_children_do_not_hang_it(ws):
    mark = f"62.{os.getpid()}{time.time_ns() % 10**6}"
    result = evaluate(
        sh(f"sleep {mark} & echo started", timeout_s=30), EvaluationInput(task={}, workspace=ws)
    )
    assert result.reward == 1.0 and result.flags == ()
    found = subprocess.run(["pgrep", "-f", f"sleep {mark}"], capture_output=True, text=True)
    assert not found.stdout.strip(), "a process the scorer left outlived it"


def test_command_without_sandbox_runs_in_the_workspace_itself(ws):
    evaluator = build_evaluator(
        CommandEvaluatorConfig(command=["sh", "-c", "touch scored"]),
        validate=False,
        sandbox=EvaluatorSandbox("none"),
    )
    assert asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=ws))).reward == 1.0
    assert (ws / "scored").exists()


def test_command_missing_task_field_is_an_evaluator_error(ws):
    with pytest.raises(EvaluatorError, match="nope"):
        evaluate(sh("echo {task[nope]}"), EvaluationInput(task={}, workspace=ws))
    with pytest.raises(EvaluatorError, match=r"\{task\[hidden\.nope\]\}"):
        evaluate(sh("echo {task[hidden.nope]}"), EvaluationInput(task={"hidden": {}}, workspace=ws))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"type": "command", "command": ["no-such-scorer-xyz"]},
            r"evaluator.command\[0\].*no-such-scorer-xyz",
        ),
        ({"type": "command", "command": ["/nonexistent/bin/score"]}, r"evaluator.command\[0\]"),
        (
            {"type": "command", "command": ["sh", "-c", "curl {base_url}"]},
            r"evaluator.command\[2\].*base_url",
        ),
        ({"type": "command", "command": []}, r"evaluator.command"),
        ({"type": "command", "command": ["sh"], "reward_from": "vibes"}, r"evaluator.command.reward_from"),
        ({"type": "command", "command": ["sh"], "shell": True}, r"evaluator.command.shell"),
        ({"type": "python", "function": "no_such_module_xyz:f"}, r"evaluator.function.*no_such_module_xyz"),
        ({"type": "python", "function": "json:no_such_function"}, r"evaluator.function.*no_such_function"),
        ({"type": "python", "function": f"{__name__}:not_callable"}, r"evaluator.function.*not callable"),
        ({"type": "python", "function": "not a path"}, r"evaluator.python.function"),
        ({"type": "reasoning_gym", "dataset": "no_such_dataset"}, r"evaluator.dataset"),
        ({"type": "reasoning_gym", "answer_pattern": "(unclosed"}, r"evaluator.answer_pattern"),
        ({"type": "reasoning_gym", "dataset": "puzzle24"}, r"evaluator.dataset: .*puzzle24.* refused"),
        ({"type": "exact_match", "pattern": "[bad"}, r"evaluator.pattern"),
        (
            {"type": "exact_match", "field": "answer"},
            r"^evaluator\.field: 'answer' is visible to the harness; put it under hidden and use 'hidden\.answer'$",
        ),
        ({"type": "exact_match", "field": "hidden"}, r"evaluator\.field: name a field under hidden"),
        ({"type": "telepathy"}, r"evaluator.type"),
    ],
)
def test_bad_config_fails_before_any_rollout(config, message):
    with pytest.raises(ConfigError, match=message):
        build_evaluator(config)


def test_relative_and_templated_executables_are_checked_at_run_time():
    build_evaluator({"type": "command", "command": ["./run_tests.sh"]})
    build_evaluator({"type": "command", "command": ["{workspace}/run_tests.sh"]})


# -- python -----------------------------------------------------------------------------------------


def test_python_sync_async_and_dict(ws):
    inp = EvaluationInput(task={}, workspace=ws, calls=[call("The answer is 42")])
    assert evaluate({"type": "python", "function": f"{__name__}:score_sync"}, inp).reward == 1.0
    with_kwargs = {"type": "python", "function": f"{__name__}:score_sync", "kwargs": {"bonus": 0.5}}
    assert evaluate(with_kwargs, inp).reward == 1.5
    result = evaluate({"type": "python", "function": f"{__name__}:score_async"}, inp)
    assert result == EvaluationResult(0.5, {"workspace": str(ws)})
    result = evaluate({"type": "python", "function": f"{__name__}:score_dict"}, inp)
    assert result.reward == 1.0 and result.details == {"why": "bool counts as 1"}


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("score_crash", "scorer bug"),
        ("score_nan", "finite"),
        ("score_huge", "finite"),
        ("score_slow", "timed out"),
    ],
)
def test_python_failures_are_evaluator_errors(ws, function, message):
    # Only the slow scorer meets the short limit: the others must fail for their own reason, on a
    # loaded machine too (a thread start can take longer than 0.3 s there).
    timeout_s = 0.3 if function == "score_slow" else 60
    config = {"type": "python", "function": f"{__name__}:{function}", "timeout_s": timeout_s}
    with pytest.raises(EvaluatorError, match=message):
        evaluate(config, EvaluationInput(task={}, workspace=ws))


@pytest.mark.parametrize(
    "reward", [math.nan, math.inf, -math.inf, pytest.param(10**400, id="int_past_float")]
)
def test_a_result_with_a_reward_that_is_not_finite_is_an_evaluator_error(reward):
    """Whoever builds it (an evaluator of a caller's own too): the controller ends the rollout on this
    error instead of passing the reward to a store that refuses it."""
    with pytest.raises(EvaluatorError, match="finite"):
        EvaluationResult(reward)
    assert EvaluationResult(-1e308).reward == -1e308


# -- reasoning_gym ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rg_evaluators():
    """One evaluator (and so one scorer process) per config for the whole module."""
    built: dict[str, ReasoningGymEvaluator] = {}

    def get(config: dict) -> ReasoningGymEvaluator:
        key = json.dumps(config, sort_keys=True)
        if key not in built:
            built[key] = build_evaluator({"type": "reasoning_gym", **config})
        return built[key]

    yield get
    for evaluator in built.values():
        asyncio.run(evaluator.aclose())


@pytest.fixture
def rg(rg_evaluators):
    def evaluate_rg(config: dict, inp: EvaluationInput) -> EvaluationResult:
        return asyncio.run(rg_evaluators(config).evaluate(inp))

    return evaluate_rg


@pytest.fixture(scope="module")
def arithmetic_task() -> dict:
    # basic_arithmetic uses reasoning-gym's default scorer, which gives partial credit.
    return next(
        t.data
        for t in reasoning_gym_tasks("basic_arithmetic", 20, seed=7)
        if len(t.data["hidden"]["answer"]) > 1
    )


def test_reasoning_gym_correct_wrong_and_formatting(ws, arithmetic_task, rg):
    gold = arithmetic_task["hidden"]["answer"]

    def reward(text: str, **config) -> float:
        inp = EvaluationInput(
            task=arithmetic_task, workspace=ws, calls=[call("thinking..."), call(text, seq=1)]
        )
        return rg(config, inp).reward

    assert reward(f"Let me see.\nAnswer: {gold}") == 1.0
    assert reward(f"**Answer:** `{gold}`.") == 1.0
    assert reward(f"Answer: 0\nwait, no.\nAnswer: {gold}") == 1.0  # the last answer counts
    assert reward("Answer: 123456789") == 0.0
    assert reward(f"<think>Answer: 1</think>{gold}") == 1.0  # fallback: last line; thinking ignored
    assert reward(f"the result is {gold}", fallback="none") == 0.0
    assert reward(f"so it is {gold} I think", fallback="last_number") == 1.0


def test_reasoning_gym_strict_vs_partial_credit(ws, arithmetic_task, rg):
    inp = EvaluationInput(
        task=arithmetic_task, workspace=ws, calls=[call(f"Answer: {arithmetic_task['hidden']['answer']}0")]
    )
    strict = rg({}, inp)
    partial = rg({"strict": False}, inp)
    assert strict.reward == 0.0 and 0.0 < partial.reward < 1.0 == strict.details["score"] + 1 - partial.reward
    assert strict.details["extracted"] == arithmetic_task["hidden"]["answer"] + "0"


def test_reasoning_gym_stored_entry_and_stdout_source(ws, rg):
    task = {
        "dataset": "basic_arithmetic",
        "question": "Calculate 2 + 5.",
        "hidden": {"answer": "7", "metadata": {}},
    }
    inp = EvaluationInput(task=task, workspace=ws, stdout="log line\n<think>Answer: 8</think>Answer: 7\n")
    assert rg({"source": "stdout"}, inp).reward == 1.0
    no_dataset = {"question": "q", "hidden": {"answer": "7"}}
    assert (
        rg(
            {"dataset": "basic_arithmetic"},
            EvaluationInput(task=no_dataset, workspace=ws, calls=[call("Answer: 7")]),
        ).reward
        == 1.0
    )
    with pytest.raises(EvaluatorError, match="dataset"):
        rg({}, EvaluationInput(task=no_dataset, workspace=ws, calls=[call("Answer: 7")]))


def test_reasoning_gym_no_answer_scores_zero_without_a_flag(ws, arithmetic_task, rg):
    result = rg(
        {"fallback": "none"}, EvaluationInput(task=arithmetic_task, workspace=ws, calls=[call("hmm")])
    )
    assert (result.reward, result.flags, result.details["extracted"]) == (0.0, (), None)


def test_reasoning_gym_isolation_is_a_checked_choice():
    assert parse_evaluator_config({"type": "reasoning_gym"}).isolation == "required"
    with pytest.raises(ConfigError, match=r"evaluator.reasoning_gym.isolation"):
        parse_evaluator_config({"type": "reasoning_gym", "isolation": "none"})
    with pytest.raises(ConfigError, match=r"evaluator.reasoning_gym.memory_mb"):
        parse_evaluator_config({"type": "reasoning_gym", "memory_mb": 1})


# -- exact_match and final answers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gold", "config", "reward"),
    [
        ("Paris", "paris", {}, 1.0),
        ("  The  Answer. ", "the answer", {}, 1.0),
        ("7.0", "7", {}, 1.0),
        ("1,000", "1000", {}, 1.0),
        ("Paris", "paris", {"normalize": False}, 0.0),
        ("I think Answer: B", ["A", "B"], {"pattern": r"Answer:\s*(\w+)"}, 1.0),
        ("no marker here", "here", {"pattern": r"Answer:\s*(.+)"}, 0.0),
        ("no marker here", "no marker here", {"pattern": r"Answer:\s*(.+)", "fallback": "last_line"}, 1.0),
    ],
)
def test_exact_match(ws, text, gold, config, reward):
    inp = EvaluationInput(task={"prompt": "q", "hidden": {"answer": gold}}, workspace=ws, calls=[call(text)])
    assert evaluate({"type": "exact_match", **config}, inp).reward == reward  # default field: hidden.answer


def test_exact_match_reads_a_dotted_path_and_names_a_missing_field(ws):
    task = {"hidden": {"gold": {"city": "Paris"}}}
    inp = EvaluationInput(task=task, workspace=ws, calls=[call("paris")])
    assert evaluate({"type": "exact_match", "field": "hidden.gold.city"}, inp).reward == 1.0
    with pytest.raises(EvaluatorError, match="hidden.solution"):
        evaluate({"type": "exact_match", "field": "hidden.solution"}, EvaluationInput(task={}, workspace=ws))
    with pytest.raises(EvaluatorError, match="hidden.answer"):  # a top-level answer is never read
        evaluate({"type": "exact_match"}, EvaluationInput(task={"answer": "x"}, workspace=ws))


def test_final_answer_text_across_shapes():
    tool_only = Call(
        rollout_id="r",
        seq=2,
        response={"role": "assistant", "content": None, "tool_calls": []},
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )
    anthropic = Call(
        rollout_id="r",
        seq=1,
        response={
            "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Answer: 3"}]
        },
        prompt_token_ids=[1],
        response_token_ids=[2],
        response_logprobs=[0.0],
    )
    assert calls_final_answer_text([call("first", seq=0), anthropic, tool_only]) == "Answer: 3"
    assert calls_final_answer_text([call("<think>x</think>\n  done  ")]) == "done"
    assert calls_final_answer_text([]) == ""


def test_parse_config_round_trip():
    config = parse_evaluator_config(
        {"type": "command", "command": ["pytest", "-q"], "reward_from": "exit_code"}
    )
    assert isinstance(config, CommandEvaluatorConfig) and config.timeout_s == 120
    assert json.loads(config.model_dump_json())["type"] == "command"


def _flagging_result(inp):
    return EvaluationResult(0.0, {"why": "no log"}, ("action_log_missing",))


def _flagging_mapping(inp):
    return {"reward": 0.0, "flags": ["action_log_invalid", "Not A Name", 7], "why": "bad log"}


@pytest.mark.parametrize(
    ("function", "flags"),
    [("_flagging_result", ("action_log_missing",)), ("_flagging_mapping", ("action_log_invalid",))],
)
def test_a_python_scorers_flags_reach_the_rollout(function, flags, tmp_path):
    """A python scorer's flags (an ``EvaluationResult``'s, or a mapping's ``"flags"`` names) were
    dropped: ScienceWorld's "no action log" 0 looked like any other 0."""
    evaluator = build_evaluator({"type": "python", "function": f"{__name__}:{function}"})
    result = asyncio.run(evaluator.evaluate(EvaluationInput(task={}, workspace=tmp_path)))
    assert result.reward == 0.0 and result.flags == flags
