"""The SWE-smith-shaped example (``examples/swe``): real PyPI projects, each task in its repository's image.

Fast: both configs are valid training configs naming one image per project, and every recipe is one
harnessrl would build. Slow (real images, real sandbox): the generator keeps a bug only when it fails
and passes the right tests inside the project's image; unmodified mini-swe-agent, played by the
scripted gold-fix policy through ``harnessrl rollout``, earns 1 inside the image while doing nothing
earns 0; and ``harnessrl train`` takes one step with the tiny model inside the images.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from tests.environments.image_support import needs_images

from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
from harnessrl.engines.scripted import ScriptedEngine
from harnessrl.environments.recipes import base_images, check_recipe
from harnessrl.store.sqlite import SQLiteStore
from harnessrl.trainer.config import TrainConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "swe"
HARNESSRL = [sys.executable, "-m", "harnessrl"]
PROJECTS = tomllib.loads((EXAMPLE / "projects.toml").read_text())


def test_example_configs_name_one_image_per_project_and_its_recipes_are_sound():
    for name in ("train.toml", "train_gpu.toml"):
        raw = resolve_relative_paths(load_raw_config(str(EXAMPLE / name), [], env={}), EXAMPLE)
        config = validate_config(TrainConfig, raw)
        environment = config.harness.environment
        assert environment is not None and environment.field == "image_name" and environment.harness == "host"
        assert set(environment.images) == {"swe-base"} | {f"swe/{p}" for p in PROJECTS}
        assert environment.images["swe-base"].debian is not None  # no registry needed
        for project in PROJECTS:
            recipe = environment.images[f"swe/{project}"]
            containerfile = Path(recipe.containerfile)
            check_recipe(containerfile, containerfile.parent, where=project)
            assert base_images(containerfile) == ["localhost/harnessrl/swe-base:latest"]
        command = config.evaluator.command
        assert command[command.index("--python") + 1] == "/usr/bin/python3"  # the image's interpreter
    for project, spec in PROJECTS.items():
        assert len(spec["sha256"]) == 64 and spec["modules"] and "[pytest]" in spec["pytest_ini"], project


def load_make_tasks():
    """``make_tasks.py`` as a module, registered under its name (its dataclasses look it up there)."""
    name = "swe_make_tasks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLE / "make_tasks.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run_make_tasks(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLE / "make_tasks.py"), "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--projects", "toolz,nosuchproject"], "--projects: unknown project 'nosuchproject'"),
        (["--per-project", "0"], "--per-project: must be at least 1"),
        (["--config", "/nonexistent/train.toml"], "--config '/nonexistent/train.toml'"),
        (["--config", "CONFIG_WITHOUT_IMAGES"], "has no [harness.environment] table"),
    ],
)
def test_make_tasks_refuses_bad_options_with_exit_2_before_creating_anything(tmp_path, args, named):
    config = tmp_path / "no-images.toml"
    config.write_text('[harness]\npreset = "mini-swe-agent"\n\n[evaluator]\ntype = "command"\n')
    args = [str(config) if a == "CONFIG_WITHOUT_IMAGES" else a for a in args]
    proc = run_make_tasks(tmp_path / "out", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert named in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_failed_rebuild_leaves_the_previous_task_set_whole(tmp_path):
    """A rerun that fails midway (here the sdist does not match its pin, as a bad download would not)
    must not leave the previous ``tasks.jsonl`` pointing at repositories it deleted."""
    out = tmp_path / "tasks"
    previous = {}
    for folder in ("repos", "hidden", "gold"):
        (out / folder / "toolz__old").mkdir(parents=True)
        (out / folder / "toolz__old" / "marker").write_text(folder)
    for name in ("tasks.jsonl", "gold_fix.json", "report.json"):
        (out / name).write_text(f"the previous {name}\n")
        previous[name] = (out / name).read_text()
    sdists = out / "sdists"
    sdists.mkdir()
    (sdists / f"toolz-{PROJECTS['toolz']['version']}.tar.gz").write_bytes(b"not the pinned sdist")
    proc = run_make_tasks(out, "--projects", "toolz", "--per-project", "1")
    assert proc.returncode != 0 and "pinned" in proc.stderr, proc.stderr[-2000:]
    for folder in ("repos", "hidden", "gold"):
        assert (out / folder / "toolz__old" / "marker").read_text() == folder
    assert {name: (out / name).read_text() for name in previous} == previous
    assert not (out / ".building").exists()


def gold_fix_calibration_max_tokens() -> int:
    """``trainer.max_tokens`` of the README's gold-fix control: its ``--set``, else train.toml's."""
    readme = (EXAMPLE / "README.md").read_text().replace("\\\n", " ")
    [line] = [x for x in readme.splitlines() if "data calibrate" in x and "gold_fix.json" in x]
    argv = shlex.split(line.split("#", 1)[0])
    sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
    train = tomllib.loads((EXAMPLE / "train.toml").read_text())
    return int(sets.get("trainer.max_tokens", train["trainer"]["max_tokens"]))


def test_the_readme_gold_fix_control_lets_the_whole_fix_through(tmp_path):
    """The gold-fix policy's first reply holds every task's fix; cut at max_tokens it fixes nothing
    and the control reports every task unsolvable. The README's command must leave room for the
    default set (12 tasks) with fixes as long as the projects' lines."""
    make_tasks = load_make_tasks()
    records = []
    for i in range(12):
        iid = f"cachetools__5.5.0.function_number_{i}.negate_condition_{100 + i}"
        (tmp_path / "gold" / iid).mkdir(parents=True)
        fix = [[100 + i, f"    if left_default == no_default and right_default == no_default_{i}:\n"]]
        mutation = {"module": "src/cachetools/__init__.py", "function": f"function_number_{i}", "fix": fix}
        (tmp_path / "gold" / iid / "mutation.json").write_text(json.dumps(mutation))
        records.append({"instance_id": iid})
    engine = ScriptedEngine(make_tasks.gold_fix_policy(tmp_path, records))
    needed = len(engine.turn_token_ids(0))
    assert needed <= gold_fix_calibration_max_tokens(), needed


def test_a_test_run_that_leaves_no_report_is_not_called_a_hang(tmp_path):
    """pytest that ends at once without its JUnit report (a sandbox that did not start, a config
    pytest refuses) is an error that shows pytest's output, not a hang."""
    make_tasks = load_make_tasks()
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\nrequired_plugins = harnessrl-no-such-plugin\n")
    (folder / "test_x.py").write_text("def test_x():\n    pass\n")
    runner = make_tasks.ImageRunner(lambda: None, tmp_path / "scratch")  # the host's root, in the sandbox
    with pytest.raises(make_tasks.NoReport) as caught:
        runner.outcomes(folder, ["test_x.py::test_x"])
    assert "without a report" in str(caught.value)
    assert "harnessrl-no-such-plugin" in str(caught.value) or "No module named pytest" in str(caught.value)


@pytest.fixture(scope="module")
def task_set(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("swe") / "tasks"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE / "make_tasks.py"), "--out", str(out), "--projects", "toolz"]
        + ["--per-project", "1"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


@pytest.mark.slow
@needs_images
def test_a_bug_is_kept_only_when_it_fails_and_passes_the_right_tests_inside_the_image(task_set: Path):
    report = json.loads((task_set / "report.json").read_text())
    toolz = report["projects"]["toolz"]
    assert toolz["kept"] == 1 and toolz["image"].startswith("localhost/harnessrl/swe-toolz:")
    assert toolz["baseline_passing"] > 100 and toolz["unconfirmed"] == 0
    [record] = records(task_set)
    assert record["image_name"] == "swe/toolz" and record["repo"] == "pypi/toolz"
    assert record["FAIL_TO_PASS"] and record["PASS_TO_PASS"]
    assert not set(record["FAIL_TO_PASS"]) & set(record["PASS_TO_PASS"])
    assert len(record["FAIL_TO_PASS"]) + len(record["PASS_TO_PASS"]) == toolz["baseline_passing"]
    function, module = record["source"]["function"], record["source"]["module"]
    assert f"`{function}` in `{module}` (toolz 1.0.0) has a bug" in record["problem_statement"]
    repo = Path(record["hidden"]["repo_path"])
    log = subprocess.run(
        ["git", "-C", str(repo), "log", "--format=%s %H"], capture_output=True, text=True
    ).stdout
    assert log.splitlines() == [f"Refactor {function} {record['base_commit']}", log.splitlines()[1]]
    assert log.splitlines()[1].startswith("Import toolz 1.0.0 ")
    hidden = Path(record["hidden"]["tests"])
    assert (hidden / "files" / "pytest.ini").is_file() and (
        hidden / "files" / "toolz/tests/test_itertoolz.py"
    ).is_file()
    gold = task_set / "gold" / record["instance_id"]
    assert (gold / "gold.patch").is_file() and not (hidden / "gold.patch").exists()  # no scorer sees it
    mutation = json.loads((gold / "mutation.json").read_text())
    assert mutation["scores"] == {"bug": 0.0, "gold": 1.0}  # confirmed by the example's own scorer


def rollout_config(tmp_path: Path, name: str, script: Path) -> Path:
    example = (EXAMPLE / "train.toml").read_text()
    harness = example[example.index("[harness]") : example.index("[controller]")]
    harness = harness.replace('"images/', f'"{EXAMPLE}/images/')  # the recipes, where they are
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{script}"\n\n{harness}\n[controller]\nmax_infra_retries = 0\n'
    )
    return config


@pytest.mark.slow
@needs_images
def test_the_gold_fix_earns_1_inside_the_image_and_doing_nothing_earns_0(task_set: Path, tmp_path: Path):
    [record] = records(task_set)
    from harnessrl.data.records import to_task

    (tmp_path / "task.json").write_text(json.dumps(to_task(record)))
    nothing = tmp_path / "nothing.json"
    submit = {
        "content": "Done.",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
        ],
    }
    nothing.write_text(json.dumps({"turns": [submit]}))
    procs = {}
    for name, script in (("gold", task_set / "gold_fix.json"), ("nothing", nothing)):
        config = rollout_config(tmp_path, name, script)
        procs[name] = subprocess.Popen(  # both at once: half the wall time
            [*HARNESSRL, "rollout", "--config", str(config), "--task", f"@{tmp_path / 'task.json'}"]
            + ["--run-dir", str(tmp_path / f"run-{name}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    summaries = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        summaries[name] = json.loads(out.strip().splitlines()[-1])
    assert summaries["gold"]["reward"] == 1.0 and summaries["gold"]["flags"] == [], summaries["gold"]
    assert summaries["nothing"]["reward"] == 0.0, summaries["nothing"]
    for name, summary in summaries.items():
        store = SQLiteStore(tmp_path / f"run-{name}" / "harnessrl.db")
        rollout = store.get_rollout(summary["rollout_id"])
        store.close()
        assert rollout.metadata["environment"]["image"].startswith("localhost/harnessrl/swe-toolz:")
        output = rollout.metadata["evaluation"]["output"]
        passing = len(record["PASS_TO_PASS"])
        assert output["pass_to_pass"] == f"{passing}/{passing}"
        expected = f"{len(record['FAIL_TO_PASS'])}/{len(record['FAIL_TO_PASS'])}" if name == "gold" else "0/"
        assert output["fail_to_pass"].startswith(expected)
        workspace = Path(summary["log"]) / "workspace"
        history = subprocess.run(
            ["git", "-C", str(workspace), "log", "--format=%s"], capture_output=True, text=True
        )
        assert history.stdout.split() == ["task", "snapshot"]  # squashed: the gold commit is gone


@pytest.mark.slow
@needs_images
def test_tiny_model_trains_one_step_inside_the_images(task_set: Path, tmp_path: Path):
    overrides = {
        "run.dir": str(tmp_path / "run"),
        "engine.model": "tiny",
        "engine.context_length": "4096",
        "tasks.path": str(task_set / "tasks.jsonl"),
        "harness.args": '["-c", "agent.step_limit=2"]',  # a random model: two calls are enough
        "trainer.mode": "sync",
        "trainer.steps": "1",
        "trainer.tasks_per_step": "1",
        "trainer.group_size": "2",
        "trainer.max_tokens": "16",
        "trainer.autocast": "none",
        "trainer.gradient_checkpointing": "false",
        "metrics.progress": "false",
    }
    argv = [*HARNESSRL, "train", str(EXAMPLE / "train.toml")]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["rollouts/total"] == 2 and row["rollouts/infra_failures"] == 0
    assert row["policy_version"] == 1
    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    rollouts = store.list_rollouts()
    store.close()
    assert len(rollouts) == 2
    for rollout in rollouts:  # each ran mini in the task's image and was scored there
        assert rollout.metadata["environment"]["image"].startswith("localhost/harnessrl/swe-toolz:")
        assert "output" in rollout.metadata["evaluation"]
