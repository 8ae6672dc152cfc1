"""The shell_agent example: small shell tasks for an unmodified mini-swe-agent, scored by check.py.

The task generator (deterministic, held-out disjoint from training), the scorer (every kind, and a
symlink never passes for the file asked for), the configs (mini gets its own config file inside the
sandbox; its first-block action regex, run through mini's own parser), a scripted policy through the
real mini-swe-agent in the sandbox (the right command earns 1, a symlink forgery 0), and the
benchmark's whole pipeline on the tiny model for 2 steps. ``examples/shell_agent/README.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.examples.example_files import load_script, make_tasks, records, scripted_rollout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "shell_agent"
MINI = Path(sys.executable).with_name("mini")

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or not MINI.exists(),
    reason="the sandbox needs root here, and mini-swe-agent in this venv",
)


def test_tasks_are_deterministic_and_the_heldout_split_shares_no_instance(tmp_path: Path):
    report = make_tasks(EXAMPLE, tmp_path / "a")
    make_tasks(EXAMPLE, tmp_path / "b")
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    train, heldout = records(tmp_path / "a" / "train.jsonl"), records(tmp_path / "a" / "heldout.jsonl")
    assert (len(train), len(heldout)) == (report["train"], report["heldout"]) == (400, 60)
    assert not {r["problem_statement"] for r in train} & {r["problem_statement"] for r in heldout}
    assert len({r["instance_id"] for r in train + heldout}) == 460
    generator = load_script(EXAMPLE, "make_tasks")
    for record in train + heldout:  # never the worked examples of mini_shell.yaml
        check = record["hidden"]["check"]
        assert not set(check["path"].split("/")) & generator.EXAMPLE_NAMES
        assert check.get("value") not in generator.EXAMPLE_NAMES
        assert "hidden" not in record["problem_statement"]
    assert set(report["heldout_families"]) == {"file", "word", "number", "dir", "file_in_dir"}
    # A different seed gives different tasks; the check that refuses overlap really refuses it.
    make_tasks(EXAMPLE, tmp_path / "c", "--seed", "1")
    assert (tmp_path / "c" / "heldout.jsonl").read_bytes() != (tmp_path / "a" / "heldout.jsonl").read_bytes()
    with pytest.raises(SystemExit, match="shares 1 task"):
        generator.check_disjoint(train[:1], train[:1])


def test_the_scorer_checks_each_kind_and_a_symlink_never_passes(tmp_path: Path):
    score = load_script(EXAMPLE, "check").score
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "answer.txt").write_text("The word is Apple.\n")
    (ws / "n.md").write_text("3290\n")
    (ws / "build").mkdir()
    (ws / "build" / "a.log").write_text("")
    outside = tmp_path / "outside.txt"
    outside.write_text("apple\n")
    (ws / "link.txt").symlink_to(outside)
    (ws / "linkdir").symlink_to(ws / "build")

    def passed(kind: str, path: str, value: str | None = None) -> bool:
        check = {"kind": kind, "path": path, **({"value": value} if value is not None else {})}
        return score(check, ws)[0]

    assert passed("file", "answer.txt") and not passed("file", "missing.txt") and not passed("file", "build")
    assert passed("contains", "answer.txt", "apple")  # a whole word, any case
    assert not passed("contains", "answer.txt", "app") and not passed("contains", "n.md", "290")
    assert passed("contains", "n.md", "3290")
    assert passed("dir", "build") and not passed("dir", "answer.txt")
    assert passed("file_in_dir", "build/a.log") and not passed("file_in_dir", "build/b.log")
    # Control: the same content as a real file passes; as a symlink (to a file the agent did not write
    # in the workspace) it does not, nor does a symlinked directory.
    (ws / "real.txt").write_text(outside.read_text())
    assert passed("contains", "real.txt", "apple")
    assert not passed("contains", "link.txt", "apple") and not passed("file", "link.txt")
    assert not passed("dir", "linkdir") and not passed("file_in_dir", "linkdir/a.log")
    with pytest.raises(ValueError, match="leaves the workspace"):
        score({"kind": "file", "path": "../outside.txt"}, ws)


def test_configs_are_valid_and_mini_reads_its_config_file_inside_the_sandbox():
    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.controller.presets import apply_preset
    from harnessrl.trainer.config import TrainConfig

    yaml_path = str(EXAMPLE / "mini_shell.yaml")
    train = validate_config(
        TrainConfig, resolve_relative_paths(load_raw_config(EXAMPLE / "train.toml"), EXAMPLE)
    )
    rollout = load_rollout_config(str(EXAMPLE / "rollout.toml"), [])
    for harness_config, evaluator in ((train.harness, train.evaluator), (rollout.harness, rollout.evaluator)):
        spec = apply_preset(harness_config)
        assert spec.args[:2] == ["-c", yaml_path] and yaml_path in spec.mounts  # config-relative, bound
        command = spec.command + spec.args
        mini_default = next(i for i, arg in enumerate(command) if Path(arg).name == "mini.yaml")
        assert command.index(yaml_path) > mini_default  # merged over mini's default
        evaluator = evaluator if isinstance(evaluator, dict) else evaluator.model_dump()
        assert evaluator["command"] == ["python3", str(EXAMPLE / "check.py")]
    assert train.trainer.max_tokens == rollout.gateway.default_max_tokens


def test_mini_parses_the_first_block_of_a_rambling_reply_with_its_own_parser():
    yaml = pytest.importorskip("yaml")
    actions_text = pytest.importorskip("minisweagent.models.utils.actions_text")
    from minisweagent.exceptions import FormatError

    config = yaml.safe_load((EXAMPLE / "mini_shell.yaml").read_text())["model"]

    def parse(content: str) -> list[dict]:
        return actions_text.parse_regex_actions(
            content,
            action_regex=config["action_regex"],
            format_error_template=config["format_error_template"],
        )

    rambling = "Sure.\n```bash\necho apple > answer.txt\n```\n\nTask: Create a file.\n```bash\nls\n```"
    assert parse(rambling) == [{"command": "echo apple > answer.txt"}]
    assert parse("```\nmkdir build\n```") == [{"command": "mkdir build"}]
    with pytest.raises(FormatError):
        parse("I would run mkdir build.")  # no block: a format error, as in mini's default
    # Control: mini's default text regex rejects the rambling reply (two blocks), which is why the
    # example configures the first-block one.
    with pytest.raises(FormatError):
        actions_text.parse_regex_actions(
            rambling, action_regex=r"```mswea_bash_command\s*\n(.*?)\n```", format_error_template="x"
        )
    assert config["model_class"] == "litellm_textbased"


@pytest.mark.slow
@needs_sandbox
def test_scripted_policy_through_real_mini_swe_agent_right_command_earns_1_forgery_0(tmp_path: Path):
    task = {
        "prompt": "Create a file named answer.txt containing the word apple.",
        "hidden": {"check": {"kind": "contains", "path": "answer.txt", "value": "apple"}},
    }
    right = scripted_rollout(
        EXAMPLE,
        tmp_path,
        "right",
        [
            "Here it is.\n```bash\necho apple > answer.txt\n```\nTask: Create a file.\n```bash\nrm answer.txt\n```",
            "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
        ],
        task,
    )
    assert right["reward"] == 1.0 and right["calls"] == 2 and right["flags"] == []
    workspace = Path(right["log"]) / "workspace"
    assert (workspace / "answer.txt").read_text() == "apple\n"  # the first block ran, not the second
    trajectory = json.loads((Path(right["log"]) / "home" / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    # A forgery: answer.txt as a symlink to a host file that holds the word. The evaluator's copy of
    # the workspace keeps the symlink, and check.py refuses it.
    forged = scripted_rollout(
        EXAMPLE,
        tmp_path,
        "forged",
        ["```bash\nln -s /usr/share/dict/words answer.txt || ln -s /etc/hostname answer.txt\n```"],
        task,
    )
    assert forged["reward"] == 0.0
    assert (Path(forged["log"]) / "workspace" / "answer.txt").is_symlink()


@pytest.mark.slow
@needs_sandbox
def test_the_benchmark_pipeline_runs_end_to_end_on_the_tiny_model(tmp_path: Path):
    out = tmp_path / "result.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "harness_learning.py"), "--model", "tiny"]
    argv += ["--steps", "2", "--save-every", "2", "--train-tasks", "8", "--heldout", "2"]
    argv += ["--work", str(tmp_path / "work"), "--out", str(out)]
    for item in (
        "trainer.tasks_per_step=2",
        "trainer.group_size=2",
        "trainer.max_tokens=16",
        "trainer.autocast=none",
        "controller.concurrency=4",
    ):
        argv += ["--set", item]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    for key in (
        "harness",
        "model",
        "heldout_success_before",
        "heldout_success_after",
        "heldout_tasks",
        "steps",
        "minutes",
        "samples_per_rollout",
        "calls_per_rollout",
    ):
        assert result[key] is not None, key
    assert result["harness"].startswith("mini-swe-agent 2.") and result["heldout_tasks"] == 2
    assert result["steps"] == 2 and result["heldout_curve"][-1][0] == 2
    assert result["rollouts_per_step"] == 4 and result["calls_per_rollout"] >= 1
    assert result["step_time_s"]["rollouts"] >= 8 and result["step_time_s"]["optimizer_s"] > 0
    assert result["eval_infra_failures"] == 0
    assert out.with_suffix(".svg").read_text().startswith("<svg")  # the README's picture, drawn from it
