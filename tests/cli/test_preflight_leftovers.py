"""Checks before a run starts, through the commands: a task its evaluator cannot score, ``run.dir``
on ``--resume`` or empty, ``images prune --keep`` with a config that has no environment; and
``GatewayClient.list_rollouts(limit=0)``. Each refusal is exit 2, one line naming the field,
nothing created; each has a control showing what passes.

Run in-process (typer's ``CliRunner``) on the tiny example's config copied into ``tmp_path``."""

from __future__ import annotations

import http.server
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from tests.cli.cli_support import TINY, invoke, listing, refused
from tests.fakes.http_server import served

from harnessrl.client import GatewayClient
from harnessrl.errors import ConfigError
from harnessrl.trainer.run_setup import CONFIG_FILE, prepare_run

EXACT_MATCH = 'evaluator={type="exact_match"}'


@pytest.fixture
def project(tmp_path: Path) -> Path:
    shutil.copy(TINY, tmp_path / "train.toml")
    shutil.copy(TINY.parent / "agent.py", tmp_path / "agent.py")
    lines = [
        {"task_id": "t0", "prompt": "2+2?", "hidden": {"answer": "4"}},
        {"task_id": "t1", "prompt": "3+3?"},  # no hidden.answer
    ]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (tmp_path / "good.jsonl").write_text(json.dumps(lines[0]) + "\n")
    return tmp_path


def train_args(project: Path, *sets: str) -> list[str]:
    args = ["train", str(project / "train.toml"), "--set", "trainer.steps=1"]
    for item in sets:
        args += ["--set", item]
    return args


def test_train_refuses_a_task_its_evaluator_cannot_score_before_the_run_folder_exists(project):
    before = listing(project)
    with pytest.raises(
        ConfigError, match=r"^tasks: task 't1': the evaluator cannot score it: .*'hidden\.answer'"
    ):
        prepare_run(
            str(project / "train.toml"), None, [EXACT_MATCH, 'tasks={type="jsonl", path="tasks.jsonl"}']
        )
    assert listing(project) == before  # no run folder, no store
    result = invoke(*train_args(project, EXACT_MATCH, 'tasks={type="jsonl", path="tasks.jsonl"}'))
    refused(result, "tasks:", "'t1'", "hidden.answer")
    held = invoke(
        *train_args(project, EXACT_MATCH, 'tasks={type="jsonl", path="good.jsonl"}')
        + ["--set", 'heldout={type="jsonl", path="tasks.jsonl"}']
    )
    refused(held, "heldout:", "'t1'", "hidden.answer")
    assert listing(project) == before
    # The control: the tasks that have the answer make a run folder.
    config, run_dir, _ = prepare_run(
        str(project / "train.toml"), None, [EXACT_MATCH, 'tasks={type="jsonl", path="good.jsonl"}']
    )
    assert run_dir.is_dir() and config.evaluator.type == "exact_match"


def test_rollout_refuses_a_task_its_evaluator_cannot_score(tmp_path):
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        '[evaluator]\ntype = "command"\ncommand = ["true", "{task[hidden.tests]}"]\n'
    )
    run_dir = tmp_path / "run"
    result = invoke(
        "rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", str(run_dir)
    )
    refused(result, "evaluator.command[1]", "'hidden.tests'")
    assert not run_dir.exists()
    exact = invoke(
        "rollout", "--config", str(config), "--task", '{"prompt": "hi", "hidden": {"tests": "x"}}',
        "--run-dir", str(run_dir), "--set", EXACT_MATCH,
    )  # fmt: skip
    refused(exact, "evaluator.field", "'hidden.answer'")
    assert not run_dir.exists()


def test_data_calibrate_refuses_a_record_its_evaluator_cannot_score(tmp_path):
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n[evaluator]\ntype = "exact_match"\n'
    )
    base = {"repo": "o/p", "base_commit": "0" * 40, "problem_statement": "What is 6*7?"}
    records = tmp_path / "in.jsonl"
    records.write_text(
        json.dumps({**base, "instance_id": "o__p.1", "answer": "42"})
        + "\n"
        + json.dumps({**base, "instance_id": "o__p.2"})  # no answer: hidden.answer missing
        + "\n"
    )
    run_dir, out = tmp_path / "run", tmp_path / "out.jsonl"
    args = ["data", "calibrate", str(records), str(out), "--config", str(config), "--k", "1"]
    refused(invoke(*args, "--run-dir", str(run_dir)), "'o__p.2'", "hidden.answer")
    assert not run_dir.exists() and not out.exists()


def resumable(project: Path) -> Path:
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, ["trainer.steps=1"])
    return run_dir


def test_resume_refuses_run_dir_and_leaves_config_json_as_it_was(project):
    run_dir = resumable(project)
    before = (run_dir / CONFIG_FILE).read_text()
    elsewhere = project / "elsewhere"
    for item in (f'run.dir="{elsewhere}"', f'run={{dir="{elsewhere}"}}', f'run.dir="{run_dir}"'):
        with pytest.raises(ConfigError, match=r"^run\.dir: cannot be set on --resume"):
            prepare_run(None, str(run_dir), [item])
        assert (run_dir / CONFIG_FILE).read_text() == before
        refused(invoke("train", "--resume", str(run_dir), "--set", item), "run.dir", "--resume")
        assert (run_dir / CONFIG_FILE).read_text() == before and not elsewhere.exists()
    # The control: another override is merged and saved.
    config, resumed, _ = prepare_run(None, str(run_dir), ["trainer.temperature=0.5"])
    assert resumed == run_dir and config.trainer.temperature == 0.5 and config.run.dir is None


def test_an_empty_run_dir_is_refused_as_the_run_dir_flag_is(project):
    before = listing(project)
    with pytest.raises(ConfigError, match=r"^run\.dir is empty"):
        prepare_run(str(project / "train.toml"), None, ['run.dir=""'])
    assert listing(project) == before  # not runs/tiny-vowels
    refused(invoke(*train_args(project, 'run.dir=""')), "run.dir")
    refused(invoke("train", str(project / "train.toml"), "--run-dir", ""), "--run-dir")
    assert listing(project) == before
    # The control: a named run.dir is used as given.
    _, run_dir, _ = prepare_run(str(project / "train.toml"), None, [f'run.dir="{project / "mine"}"'])
    assert run_dir == project / "mine" and run_dir.is_dir()


def test_rollout_and_controller_refuse_an_empty_run_dir(tmp_path, monkeypatch):
    """``--run-dir ""`` (an unset variable): rollout used a temp folder, controller the working
    directory, without a word. The control: a named folder is used."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        '[evaluator]\ntype = "command"\ncommand = ["true"]\n'
    )
    before = listing(tmp_path)
    refused(
        invoke("rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", ""), "--run-dir"
    )
    controller = invoke(
        "controller", "--config", str(config), "--store", str(tmp_path / "none.db"),
        "--gateway-url", "http://127.0.0.1:9", "--run-dir", "",
    )  # fmt: skip
    refused(controller, "--run-dir")
    assert listing(tmp_path) == before
    done = invoke("rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", "mine")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output.strip().splitlines()[-1])["store"] == "mine/harnessrl.db"
    assert (tmp_path / "mine" / "harnessrl.db").is_file()


def test_images_prune_keep_names_a_config_without_environments(tmp_path):
    config = tmp_path / "plain.toml"
    config.write_text('[harness]\ncommand = ["true"]\n')
    store = tmp_path / "store"
    store.mkdir()
    result = invoke("images", "prune", "--store", str(store), "--keep", str(config))
    refused(result, "--keep", "plain.toml", "[harness.environment]")
    assert "nothing to build" not in result.output
    assert listing(store) == []
    # The control: build, which does build, still says there is nothing to build.
    refused(invoke("images", "build", str(config), "--store", str(store)), "nothing to build")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers ``[]`` to every GET and keeps the query each one sent."""

    queries: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        Recorder.queries.append(parse_qs(urlparse(self.path).query))
        body = b"[]"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder_url() -> Iterator[str]:
    Recorder.queries = []
    with served(Recorder) as url:
        yield url


def test_list_rollouts_sends_a_zero_limit_and_offset(recorder_url):
    """``limit=0`` was dropped (a falsy check): the gateway's default 100 came back instead of its
    answer to 0 (a 400: limit must be >= 1)."""
    with GatewayClient(recorder_url, "key") as client:
        assert client.list_rollouts(limit=0, offset=0) == []
        assert client.list_rollouts(limit=5, status="queued") == []  # the control
        assert client.list_rollouts() == []
    assert Recorder.queries == [{"limit": ["0"], "offset": ["0"]}, {"status": ["queued"], "limit": ["5"]}, {}]
