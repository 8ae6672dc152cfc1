"""Inputs the commands used to take wrongly: a gateway that created its store before finding a bad
engine, parser or store path (exit 1, a traceback for a missing GPU); ``train``/``sft`` that
silently ignored CONFIG given with ``--resume``; ``--run-dir`` values read as TOML (``42``,
``2026-12-06``); an override value that parses as several TOML keys. Run in-process (typer's
``CliRunner``) with real files; every case lists the folder it ran in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.cli.test_bad_input import TINY, invoke, refused
from tests.sft.conftest import record, solving, tokenizer  # noqa: F401 (fixtures: a recorded teacher run)

from harnessrl.config import literal_override, load_raw_config


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_gateway_refuses_bad_engine_parser_and_store_inputs_before_creating_its_store(tmp_path):
    store = tmp_path / "s" / "x.db"
    (tmp_path / "empty.json").write_text(json.dumps({"turns": []}))
    (tmp_path / "a-file").write_text("")
    gateway = ["gateway", "--port", "0"]
    cases = [
        (["--model", str(tmp_path / "no-model"), "--store", str(store)], ["--model", "no-model"]),
        (["--model", f"scripted:{tmp_path / 'empty.json'}", "--store", str(store)], ["--model", "turns"]),
        (["--model", f"scripted:{tmp_path / 'nope.json'}", "--store", str(store)], ["--model", "nope.json"]),
        (
            ["--set", f"engine.model=scripted:{tmp_path / 'nope.json'}", "--store", str(store)],
            ["engine.model"],
        ),
        (["--set", "gateway.tool_call_parser=bogus", "--store", str(store)], ["gateway.tool_call_parser"]),
        (
            ["--model", "vllm:http://127.0.0.1:9", "--set", f"engine.tokenizer={tmp_path / 'no-tok'}"]
            + ["--store", str(store)],
            ["engine.tokenizer"],
        ),
        (["--store", str(tmp_path / "a-file" / "x.db")], ["--store", "a-file"]),
        (["--set", f"store.url={tmp_path / 'a-file' / 'x.db'}"], ["store.url", "a-file"]),
    ]
    for args, named in cases:
        refused(invoke(*gateway, *args), *named)
        assert listing(tmp_path) == ["a-file", "empty.json"], args


def test_gateway_refuses_a_cuda_device_this_machine_lacks_before_creating_its_store(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    store = tmp_path / "s" / "x.db"
    refused(
        invoke("gateway", "--port", "0", "--set", "engine.device=cuda", "--store", str(store)),
        "engine.device",
    )
    assert listing(tmp_path) == []


@pytest.mark.parametrize("command", ["train", "sft"])
def test_config_with_resume_is_refused_not_ignored(tmp_path, command):
    """CONFIG given with --resume used to be ignored without a word (the run resumed with its saved
    config.json, whatever the file said)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")
    config = tmp_path / "c.toml"
    config.write_text("")
    refused(invoke(command, str(config), "--resume", str(run_dir)), "--resume", "not both")
    assert listing(tmp_path) == ["c.toml", "run", "run/config.json"]
    assert (run_dir / "config.json").read_text() == "{}"


@pytest.mark.parametrize("name", ["2026-12-06", "42", "true", '"quoted"'])
def test_run_dir_is_a_folder_name_not_a_toml_value(tmp_path, monkeypatch, name):
    """``--run-dir 42`` used to be refused ("run.dir: Input should be a valid string"), and
    ``--run-dir '"quoted"'`` named the folder ``quoted``. An existing folder of that exact name is
    found and refused as "already exists", before anything is created."""
    monkeypatch.chdir(tmp_path)
    # Both the exact name and what TOML made of a quoted one exist: no version of the command
    # (the old one included) finds a new folder to start a training in.
    for folder in {name, name.strip('"')}:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "keep").write_text("")
    refused(invoke("train", str(TINY), "--run-dir", name), "already exists", f"{name}'")
    assert listing(tmp_path) == sorted(x for f in {name, name.strip('"')} for x in (f, f"{f}/keep"))


def test_literal_override_round_trips_any_string():
    for value in ["2026-12-06", "42", "inf", "", 'a"b\\c', "x\ny", "\x7f\x00t\tz", "é🙂", "[1, 2]", "a = b"]:
        raw = load_raw_config(None, [literal_override("run.dir", value)], env={})
        assert raw == {"run": {"dir": value}}, value


def test_an_override_value_that_parses_as_several_keys_is_text():
    """``tomllib.loads("v = 1\\nsteps = 5")`` has two keys: the value used to be 1, the rest dropped."""
    raw = load_raw_config(None, ["harness.note=1\nsteps = 5"], env={})
    assert raw == {"harness": {"note": "1\nsteps = 5"}}
    assert load_raw_config(None, ["trainer.steps=5"], env={}) == {"trainer": {"steps": 5}}  # control


def test_a_string_field_given_a_toml_number_says_how_to_quote_it(tmp_path):
    """``--set run.name=123`` is the integer 123 (values are TOML); the refusal used to end at
    "Input should be a valid string", with no way forward."""
    result = invoke("train", str(TINY), "--set", "run.name=123")
    refused(result, "run.name", "--set run.name='\"123\"'")
    result = invoke("train", str(TINY), "--set", "harness.env.SEED=2026-12-06")
    refused(result, "harness.env.SEED", "--set harness.env.SEED='\"2026-12-06\"'")
    # Control: quoted, the value is text and that field is accepted (the run stops at another).
    result = invoke("train", str(TINY), "--set", 'run.name="123"', "--set", "trainer.steps=0")
    refused(result, "trainer.steps")
    assert "run.name" not in result.output
    assert listing(tmp_path) == []


def test_an_environment_variable_without_a_section_or_key_is_named(monkeypatch):
    for name in ("HARNESSRL___X", "HARNESSRL_GATEWAY__"):
        monkeypatch.setenv(name, "1")
        refused(invoke("gateway", "--port", "1"), name)
        monkeypatch.delenv(name)


def test_sft_export_never_replaces_its_config_or_a_file_of_the_resumed_run(tmp_path):
    """``sft sft.toml --export-jsonl sft.toml`` used to replace the config with the export (an
    empty file when nothing matched), and ``--resume RUN --export-jsonl RUN/config.json`` the run's
    saved config: the run could not be resumed any more."""
    from harnessrl.sft.run import prepare_sft_run

    config = tmp_path / "sft.toml"
    text = '[run]\nname = "student"\n[source]\nrun_dir = "teacher"\n[sft]\nmodel = "tiny"\n'
    config.write_text(text)
    (tmp_path / "link.toml").symlink_to(config)
    for target in (config, tmp_path / "link.toml"):
        refused(invoke("sft", str(config), "--export-jsonl", str(target)), "--export-jsonl", "CONFIG")
        assert config.read_text() == text
    run = tmp_path / "student"
    run.mkdir()
    saved, _ = prepare_sft_run(str(config), None, [], export=True)
    (run / "config.json").write_text(json.dumps(saved.model_dump(mode="json")))
    before = (run / "config.json").read_text()
    refused(invoke("sft", "--resume", str(run), "--export-jsonl", str(run / "config.json")), "--export-jsonl")
    assert (run / "config.json").read_text() == before
    assert listing(tmp_path) == ["link.toml", "sft.toml", "student", "student/config.json"]


def test_sft_export_of_a_real_selection_leaves_its_config_as_it_was(record, solving, tmp_path):  # noqa: F811
    """With rollouts to export, the old command wrote them over CONFIG: the config was gone."""
    rec = record([solving], [1.0])
    config = tmp_path / "sft.toml"
    text = f'[run]\nname = "student"\n[source]\nrun_dir = "{rec.run_dir}"\n[sft]\nmodel = "tiny"\n'
    config.write_text(text)
    refused(invoke("sft", str(config), "--export-jsonl", str(config)), "--export-jsonl", "CONFIG")
    assert config.read_text() == text
    # Control: the same export to its own file writes the conversation.
    out = tmp_path / "out.jsonl"
    assert invoke("sft", str(config), "--export-jsonl", str(out)).exit_code == 0
    assert len(out.read_text().splitlines()) == 1


@pytest.mark.parametrize("command", ["train", "sft"])
def test_an_empty_run_dir_is_refused_not_replaced_by_the_default(tmp_path, monkeypatch, command):
    """``--run-dir "$UNSET"`` used to start the run in the default folder without a word."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "train.toml"
    config.write_text(TINY.read_text())
    (tmp_path / "agent.py").write_text((TINY.parent / "agent.py").read_text())
    # The default folder exists: no version of the command (the old one included) starts a run.
    (tmp_path / "runs" / "tiny-vowels").mkdir(parents=True)
    (tmp_path / "runs" / "tiny-vowels" / "keep").write_text("")
    before = listing(tmp_path)
    refused(invoke(command, str(config), "--run-dir", ""), "--run-dir", "empty")
    assert listing(tmp_path) == before


def test_python_m_gateway_refuses_bad_inputs_before_creating_its_store(tmp_path):
    """``python -m harnessrl.gateway`` (the entry point tests and scripts start) used to open its
    store before it looked at the model or the tokenizer: a bad ``--model`` left ``x.db`` behind."""
    import subprocess
    import sys

    (tmp_path / "a-file").write_text("")
    store = str(tmp_path / "s" / "x.db")
    cases = [
        (["--model", str(tmp_path / "no-model"), "--store", store], "--model"),
        (
            ["--model", "vllm:http://127.0.0.1:9", "--tokenizer", str(tmp_path / "no-tok"), "--store", store],
            "--tokenizer",
        ),
        (["--store", str(tmp_path / "a-file" / "x.db")], "--store"),
    ]
    for args, named in cases:
        done = subprocess.run(
            [sys.executable, "-m", "harnessrl.gateway", "--port", "0", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (args, done.stderr[-2000:])
        assert named in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert listing(tmp_path) == ["a-file"], args
