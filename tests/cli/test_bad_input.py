"""Bad input to the ``harnessrl`` commands: one line naming the bad field or option, exit status 2,
no traceback, and nothing half-created (no run folder, no store file, no temp folder).

Run in-process (typer's ``CliRunner``) to stay fast; every case lists the folder it ran in."""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.cli_support import TINY, invoke, listing
from typer.testing import Result


def refused(result: Result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AttributeError | TypeError)
    for name in named:
        assert name in result.output, result.output


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something listens on for the length of the test."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


@pytest.fixture
def temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp folder commands make their own folders in (``tempfile.mkdtemp``), empty at start."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def rollout_config(tmp_path: Path) -> Path:
    """A rollout that starts nothing heavy: a scripted engine, ``python -c pass`` as harness (the
    preset runs ``command`` with its interpreter) and ``true`` as evaluator."""
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n'
    )
    return config


def test_gateway_validates_its_store_section(tmp_path, busy_port):
    cases = {
        '[store]\nurll = "x.db"\n': "store.urll",  # a typo used to be ignored (the default store used)
        "[store]\nurl = 5\n": "store.url",
        'store = "x.db"\n': "store: must be a [store] table",
        "gateway = 5\n": "gateway: must be a [gateway] table",
    }
    for text, named in cases.items():
        config = tmp_path / "g.toml"
        config.write_text(text)
        # A busy port: were the config accepted, the command ends (exit 1) instead of serving.
        refused(invoke("gateway", "--config", str(config), "--port", str(busy_port)), named)
        assert listing(tmp_path) == ["g.toml"], text


def test_rollout_with_a_busy_port_creates_nothing(tmp_path, busy_port, temp_dir):
    config = rollout_config(tmp_path)
    task = '{"prompt": "hi"}'
    run = ["rollout", "--config", str(config), "--task", task, "--set", f"gateway.port={busy_port}"]
    refused(invoke(*run, "--run-dir", str(tmp_path / "r")), "cannot listen", str(busy_port))
    assert not (tmp_path / "r").exists()  # nor its harnessrl.db
    refused(invoke(*run), "cannot listen")
    assert listing(temp_dir) == []  # no /tmp/harnessrl-rollout-* folder, with or without a store
    # A folder the user gave that existed before is kept as it was.
    (tmp_path / "mine").mkdir()
    refused(invoke(*run, "--run-dir", str(tmp_path / "mine")), "cannot listen")
    assert listing(tmp_path / "mine") == []


def test_config_files_that_cannot_be_read_are_named(tmp_path):
    folder = tmp_path / "conf.toml"
    folder.mkdir()
    refused(invoke("train", str(folder)), "conf.toml", "is a folder")
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[run]\nname = "caf\xe9"\n'.encode("latin-1"))
    refused(invoke("train", str(latin1)), "latin1.toml", "UTF-8")
    assert listing(tmp_path) == ["conf.toml", "latin1.toml"]


def test_rollout_names_bad_task_files_and_bad_image_tables(tmp_path, temp_dir):
    config = rollout_config(tmp_path)
    before = listing(tmp_path)
    refused(invoke("rollout", "--config", str(config), "--task", "@missing.json"), "--task", "missing.json")
    images = invoke(
        "rollout", "--config", str(config), "--task", '{"prompt": "hi"}',
        "--set", "harness.environment.images=[1]",
    )  # fmt: skip
    refused(images, "harness.environment.images")
    assert listing(tmp_path) == before and listing(temp_dir) == []


def test_controller_names_a_gateway_url_with_a_bad_port(tmp_path):
    config = rollout_config(tmp_path)
    before = listing(tmp_path)
    result = invoke(
        "controller", "--config", str(config), "--store", str(tmp_path / "s.db"),
        "--gateway-url", "http://127.0.0.1:99999", "--run-dir", str(tmp_path / "c"),
    )  # fmt: skip
    refused(result, "--gateway-url")
    assert listing(tmp_path) == before


def test_dashboard_names_a_bad_or_busy_port(tmp_path, busy_port):
    from harnessrl.store import open_store

    run = tmp_path / "run"
    run.mkdir()
    open_store(str(run / "harnessrl.db")).close()
    for port in ("70000", "-5"):
        refused(invoke("dashboard", "--run-dir", str(run), "--port", port), "--port")
    refused(invoke("dashboard", "--run-dir", str(run), "--port", str(busy_port)), "--port", "cannot listen")
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # (reading the store adds its -wal file)


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    sft = tmp_path / "sft.toml"
    sft.write_text(f'[source]\nrun_dir = "{tmp_path / "teacher"}"\n[sft]\nmodel = "tiny"\n')
    refused(invoke("train", str(TINY), "--run-dir", str(tmp_path / "f")), "run.dir", "is a file")
    refused(invoke("sft", str(sft), "--run-dir", str(tmp_path / "f")), "run.dir", "is a file")
    refused(invoke("train", str(TINY), "--run-dir", str(tmp_path / "f" / "sub")), "run.dir", "is a file")
    assert listing(tmp_path) == ["f", "sft.toml"]


def test_data_calibrate_leaves_no_temp_folder_on_a_config_error(tmp_path, temp_dir):
    config = rollout_config(tmp_path)
    records = tmp_path / "in.jsonl"
    records.write_text(json.dumps({"instance_id": "a", "prompt": "hi"}) + "\n")
    before = listing(tmp_path)
    result = invoke(
        "data", "calibrate", str(records), str(tmp_path / "out.jsonl"), "--config", str(config), "--k", "0"
    )
    refused(result, "--k")
    assert listing(temp_dir) == [] and listing(tmp_path) == before


def test_images_build_names_a_harness_that_is_not_a_table(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('harness = "x"\n')
    refused(invoke("images", "build", str(config)), "harness: must be a [harness] table")
    assert listing(tmp_path) == ["c.toml"]


def test_an_override_without_a_key_is_refused(tmp_path):
    for item in ("=5", "trainer..steps=5"):
        refused(invoke("train", str(TINY), "--run-dir", str(tmp_path / "run"), "--set", item), repr(item))
    assert listing(tmp_path) == []


def test_gateway_refuses_workers_its_engine_cannot_run_with(tmp_path, busy_port):
    store = str(tmp_path / "s.db")
    # A busy port: were the config accepted, the command ends instead of serving.
    workers = ["--workers", "2", "--store", store, "--port", str(busy_port)]
    refused(invoke("gateway", *workers), "gateway.workers", "'tiny'")  # the default, embedded model
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    teacher = [
        "--set", f"engine.teacher.base_url=http://127.0.0.1:{busy_port}/v1",
        "--set", "engine.teacher.model=t", "--set", "engine.teacher.timeout_s=1",
    ]  # fmt: skip
    result = invoke("gateway", "--model", f"scripted:{tmp_path / 'replies.json'}", *workers, *teacher)
    refused(result, "engine.teacher", "gateway.workers")
    assert listing(tmp_path) == ["replies.json"]  # no store


def test_data_filter_refuses_a_negative_max_tests_and_outputs_under_a_file(tmp_path):
    records = tmp_path / "in.jsonl"
    records.write_text(json.dumps({"instance_id": "a", "problem_statement": "hi"}) + "\n")
    out = str(tmp_path / "out.jsonl")
    # A negative --max-tests used to keep no record and exit 0.
    refused(invoke("data", "filter", str(records), out, "--max-tests", "-1"), "--max-tests")
    (tmp_path / "f").write_text("")
    refused(invoke("data", "filter", str(records), str(tmp_path / "f" / "out.jsonl")), "OUT", "is a file")
    # The report is checked before OUT is written too.
    refused(
        invoke("data", "filter", str(records), out, "--report", str(tmp_path / "f" / "r.json")),
        "--report",
        "is a file",
    )
    split = ["data", "split", str(records), "--train", out, "--test-size", "0"]
    refused(invoke(*split, "--test", str(tmp_path / "f" / "t.jsonl")), "--test: ", "is a file")
    assert listing(tmp_path) == ["f", "in.jsonl"]


def test_export_refuses_an_out_folder_under_a_file(tmp_path):
    checkpoint = tmp_path / "ckpt"  # what run_checkpoint takes for a checkpoint; nothing is loaded
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "model.safetensors").write_text("")
    (tmp_path / "f").write_text("")
    refused(invoke("export", "--merged", str(checkpoint), str(tmp_path / "f" / "out")), "OUT", "is a file")
    assert listing(tmp_path) == ["ckpt", "ckpt/config.json", "ckpt/model.safetensors", "f"]


def test_sft_export_refuses_a_path_under_a_file_and_a_run_dir(tmp_path):
    (tmp_path / "f").write_text("")
    sft = tmp_path / "sft.toml"
    sft.write_text(f'[source]\nrun_dir = "{tmp_path / "teacher"}"\n[sft]\nmodel = "tiny"\n')
    export = ["sft", str(sft), "--export-jsonl"]
    refused(invoke(*export, str(tmp_path / "f" / "o.jsonl")), "--export-jsonl", "is a file")
    # An export writes no run folder: --run-dir used to be ignored without a word.
    refused(
        invoke(*export, str(tmp_path / "o.jsonl"), "--run-dir", str(tmp_path / "r")),
        "--export-jsonl",
        "--run-dir",
    )
    assert listing(tmp_path) == ["f", "sft.toml"]


@pytest.mark.parametrize("command", [["list"], ["df"], ["prune", "--all"]])
def test_images_commands_name_a_store_that_is_not_there(tmp_path, command):
    """``images list/df/prune --store MISSING`` used to have podman set up a whole new store there."""
    missing = tmp_path / "no-store"
    refused(invoke("images", *command, "--store", str(missing)), "--store")
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_images_prune_with_keep_and_all_is_one_error_line(tmp_path):
    """Refused with typer's usage box before (a ``BadParameter`` raised in the command's body)."""
    (tmp_path / "keep.toml").write_text("")
    result = invoke("images", "prune", "--keep", str(tmp_path / "keep.toml"), "--all")
    refused(result, "harnessrl: error: --keep and --all")
    assert "Usage" not in result.output


@pytest.mark.parametrize("key", ["ключ", "two words"])
def test_gateway_refuses_an_admin_key_no_header_can_carry(tmp_path, busy_port, monkeypatch, key):
    """An HTTP header carries bytes: a non-ASCII key arrived as other characters than the config's
    (latin-1 decoded) and no request could ever authenticate with it."""
    monkeypatch.setenv("HARNESSRL_ADMIN_KEY", key)
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    args = ["--model", f"scripted:{tmp_path / 'replies.json'}", "--store", str(tmp_path / "s.db")]
    refused(invoke("gateway", *args, "--port", str(busy_port)), "gateway.admin_key")
    assert listing(tmp_path) == ["replies.json"]


@pytest.fixture
def second_busy_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_gateway_flags_given_win_over_the_config_file_and_the_environment(
    tmp_path, busy_port, second_busy_port, monkeypatch
):
    """Values from --config and HARNESSRL_* used to be merged on top of explicit flags. Each case
    ends before serving (a busy port, or workers an engine cannot run with) with a message naming
    the value that won."""
    config = tmp_path / "g.toml"
    config.write_text(f'[gateway]\nport = {busy_port}\n[engine]\nmodel = "smollm2"\n[store]\nurl = "x.db"\n')
    flag_port = ["--config", str(config), "--port", str(second_busy_port)]
    result = invoke("gateway", *flag_port)
    assert result.exit_code == 1 and f":{second_busy_port}" in result.output, result.output
    # A flag left out does not override the file: its port is the file's.
    result = invoke("gateway", "--config", str(config))
    assert result.exit_code == 1 and f":{busy_port}" in result.output, result.output
    monkeypatch.setenv("HARNESSRL_GATEWAY__PORT", str(busy_port))
    result = invoke("gateway", "--port", str(second_busy_port), "--model", "tiny")
    assert result.exit_code == 1 and f":{second_busy_port}" in result.output, result.output
    monkeypatch.delenv("HARNESSRL_GATEWAY__PORT")
    # --model: the workers check names the engine model that won.
    refused(invoke("gateway", *flag_port, "--workers", "2", "--model", "tiny"), "gateway.workers", "'tiny'")
    refused(invoke("gateway", *flag_port, "--workers", "2"), "'smollm2'")  # the file's, with no --model
    # --store: the workers check refuses :memory: (the file's x.db would go on to the busy port).
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    scripted = ["--model", f"scripted:{tmp_path / 'replies.json'}", "--workers", "2"]
    refused(invoke("gateway", *flag_port, *scripted, "--store", ":memory:"), ":memory:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.toml", "replies.json"]


@pytest.mark.parametrize("command", ["rollout", "rollout-sub", "controller", "calibrate"])
def test_output_folders_that_are_files_are_named_before_anything_starts(tmp_path, temp_dir, command):
    """``rollout``/``controller``/``data calibrate`` ``--run-dir`` naming a file (or a path under
    one) used to end in a traceback, the controller's after it had created its store."""
    config = rollout_config(tmp_path)
    (tmp_path / "afile").write_text("")
    records = tmp_path / "in.jsonl"
    records.write_text(json.dumps({"instance_id": "a", "prompt": "hi"}) + "\n")
    before = listing(tmp_path)
    rollout = ["rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir"]
    args = {
        "rollout": [*rollout, str(tmp_path / "afile")],
        "rollout-sub": [*rollout, str(tmp_path / "afile" / "sub")],
        "controller": [
            "controller", "--config", str(config), "--store", str(tmp_path / "s.db"),
            "--gateway-url", "http://127.0.0.1:8000", "--run-dir", str(tmp_path / "afile"),
        ],
        "calibrate": [
            "data", "calibrate", str(records), str(tmp_path / "out.jsonl"), "--config", str(config),
            "--run-dir", str(tmp_path / "afile"),
        ],
    }  # fmt: skip
    refused(invoke(*args[command]), "--run-dir", "is a file")
    assert listing(tmp_path) == before and listing(temp_dir) == []  # no store, no output


def test_a_rollout_with_an_unknown_parser_creates_no_store(tmp_path, temp_dir):
    config = rollout_config(tmp_path)
    before = listing(tmp_path)
    for field in ("gateway.tool_call_parser", "gateway.reasoning_parser"):
        result = invoke(
            "rollout", "--config", str(config), "--task", '{"prompt": "hi"}',
            "--set", f"{field}=banana", "--run-dir", str(tmp_path / "rd2"),
        )  # fmt: skip
        refused(result, field, "banana")
    assert listing(tmp_path) == before and listing(temp_dir) == []  # no rd2/harnessrl.db


def test_data_commands_refuse_two_outputs_that_are_one_file(tmp_path):
    """``split --train X --test X`` kept only the test records; ``--report`` naming an output
    overwrote it with the report."""
    records = tmp_path / "in.jsonl"
    lines = [
        json.dumps({"instance_id": f"r{i}", "problem_statement": "hi", "repo": f"o/r{i}"}) for i in range(4)
    ]
    records.write_text("\n".join(lines) + "\n")
    same = str(tmp_path / "same.jsonl")
    split = ["data", "split", str(records), "--test-size", "1"]
    refused(invoke(*split, "--train", same, "--test", same), "--test", "same file", "--train")
    other = str(tmp_path / "other.jsonl")
    refused(invoke(*split, "--train", same, "--test", other, "--report", same), "--report", "--train")
    # the same file by another spelling (.. and a symbolic link) is the same file
    (tmp_path / "sub").mkdir()
    refused(invoke(*split, "--train", same, "--test", str(tmp_path / "sub" / ".." / "same.jsonl")), "--test")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "same.jsonl")
    refused(invoke(*split, "--train", same, "--test", str(tmp_path / "link.jsonl")), "--test")
    refused(invoke("data", "filter", str(records), same, "--report", same), "--report", "OUT")
    assert listing(tmp_path) == ["in.jsonl", "link.jsonl", "sub"]
    # Control: distinct files are written.
    assert invoke(*split, "--train", same, "--test", other).exit_code == 0


def test_input_nested_too_deeply_to_read_is_named(tmp_path, temp_dir, monkeypatch):
    """tomllib and json recurse once per level: a config file, a ``--set`` value, a ``HARNESSRL_*``
    variable or a ``--task`` of ``[[[[...`` was a RecursionError traceback (exit 1) in every command."""
    deep = "[" * 50_000 + "]" * 50_000
    (tmp_path / "deep.toml").write_text(f"a = {deep}\n")
    (tmp_path / "deep.json").write_text(deep)
    config = rollout_config(tmp_path)
    before = listing(tmp_path)
    for args in (
        ["rollout", "--config", str(tmp_path / "deep.toml")],
        ["train", str(tmp_path / "deep.toml")],
    ):
        refused(invoke(*args), "deep.toml", "nested too deeply")
    refused(invoke("gateway", "--config", str(tmp_path / "deep.toml")), "deep.toml", "nested too deeply")
    refused(
        invoke("rollout", "--config", str(config), "--set", f"task.x={deep}"), "task.x", "nested too deeply"
    )
    refused(
        invoke("rollout", "--config", str(config), "--task", f"@{tmp_path / 'deep.json'}"), "--task", "nested"
    )
    monkeypatch.setenv("HARNESSRL_TASK__X", deep)
    refused(invoke("rollout", "--config", str(config)), "HARNESSRL_TASK__X", "nested too deeply")
    assert listing(tmp_path) == before and listing(temp_dir) == []


def test_data_calibrate_refuses_a_run_dir_that_is_out_or_the_report(tmp_path, temp_dir):
    """``--run-dir`` naming OUT (or --report, or a folder under either): the run folder was made
    there, every rollout of the first batch ran, and appending to OUT was an IsADirectoryError."""
    config = rollout_config(tmp_path)
    records = tmp_path / "in.jsonl"
    records.write_text(json.dumps({"instance_id": "a", "problem_statement": "hi"}) + "\n")
    before = listing(tmp_path)
    calibrate = ["data", "calibrate", str(records), str(tmp_path / "out.jsonl"), "--config", str(config)]
    calibrate += ["--k", "1", "--report", str(tmp_path / "r.json"), "--run-dir"]
    for run_dir, named in (("out.jsonl", "is OUT"), ("out.jsonl/sub", "is OUT"), ("r.json", "is --report")):
        refused(invoke(*calibrate, str(tmp_path / run_dir)), "--run-dir", named)
        assert listing(tmp_path) == before, run_dir
    # Control: a run folder of its own is used, and OUT is written.
    assert invoke(*calibrate, str(tmp_path / "run")).exit_code == 0
    assert (tmp_path / "out.jsonl").is_file() and (tmp_path / "run" / "harnessrl.db").is_file()


def test_an_integer_past_pythons_digit_limit_is_named(tmp_path, temp_dir, monkeypatch):
    """json and tomllib refuse an integer of over 4,300 digits with a bare ValueError, not their decode
    errors: a ``--task``, ``--set`` value, config file or ``HARNESSRL_*`` variable holding one was a
    traceback (exit 1)."""
    huge = "1" * 5_000
    (tmp_path / "huge.json").write_text(f'{{"prompt": "p", "n": {huge}}}')
    config = rollout_config(tmp_path)
    before = listing(tmp_path)
    refused(invoke("rollout", "--config", str(config), "--task", f"@{tmp_path / 'huge.json'}"), "--task")
    refused(invoke("rollout", "--config", str(config), "--task", f'{{"n": {huge}}}'), "--task")
    refused(invoke("rollout", "--config", str(config), "--set", f"task.x={huge}"), "task.x")
    (tmp_path / "huge.toml").write_text(f"a = {huge}\n")
    refused(invoke("rollout", "--config", str(tmp_path / "huge.toml")), "huge.toml")
    before = listing(tmp_path)
    monkeypatch.setenv("HARNESSRL_TASK__X", huge)
    refused(invoke("rollout", "--config", str(config)), "HARNESSRL_TASK__X")
    assert listing(tmp_path) == before and listing(temp_dir) == []


def test_a_pause_timeout_past_what_the_control_api_takes_is_refused(tmp_path, busy_port):
    """``POST /api/pause?timeout=`` takes at most a day: a longer ``gateway.pause_timeout_s`` passed
    the config and failed a training run's first pause (driving a gateway by URL) with a 400."""
    config = tmp_path / "g.toml"
    config.write_text("[gateway]\npause_timeout_s = 100000\n")
    refused(invoke("gateway", "--config", str(config), "--port", str(busy_port)), "gateway.pause_timeout_s")
    config.write_text("[gateway]\npause_timeout_s = 86400\n")  # control: a day is taken (then the busy port)
    result = invoke("gateway", "--config", str(config), "--port", str(busy_port))
    assert "pause_timeout_s" not in result.output, result.output
