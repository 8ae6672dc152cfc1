"""The ``harnessrl`` command: help is fast and torch-free, every command documents itself, and bad
input gets one clear line naming the problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HARNESSRL = [sys.executable, "-m", "harnessrl"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HARNESSRL, *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_command():
    out = run("--help").stdout
    for command in ("gateway", "rollout", "controller", "train", "version"):
        assert command in out


def test_cli_and_gateway_modules_do_not_import_torch():
    code = (
        "import sys, harnessrl.cli.main, harnessrl.gateway.app, harnessrl.store.sqlite, "
        "harnessrl.engines.scripted, harnessrl.trajectory, harnessrl.algorithms, harnessrl.controller.controller; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_each_command_has_help():
    for command in ("gateway", "rollout", "controller", "train"):
        proc = run(command, "--help")
        assert proc.returncode == 0 and "Usage" in proc.stdout


def test_help_texts_keep_toml_section_names():
    # Rich markup used to eat "[harness]" as a style tag: "TOML file: , , , ,".
    out = run("rollout", "--help").stdout
    assert "[harness]" in out and "[evaluator]" in out
    assert "[harness]" in run("data", "calibrate", "--help").stdout


def test_version_flag_and_command_print_the_version():
    from harnessrl import __version__

    for args in (("--version",), ("version",)):
        proc = run(*args)
        assert proc.returncode == 0 and proc.stdout.strip() == __version__, proc.stderr


def test_split_flag_reads_as_written():
    out = run("data", "split", "--help").stdout
    assert "--no-repo-leakage" in out and "--no-no-repo-leakage" not in out


def test_run_dir_is_one_option_name_everywhere(tmp_path):
    for command in (("train",), ("dashboard",), ("rollout",), ("controller",), ("data", "calibrate")):
        assert "--run-dir" in run(*command, "--help").stdout, command
    both = run("train", "--run-dir", str(tmp_path / "a"), "--resume", str(tmp_path / "b"))
    assert both.returncode == 2 and "not both" in both.stderr
    assert not (tmp_path / "a").exists()


def test_rollout_refuses_a_missing_harness_script(tmp_path):
    config = tmp_path / "rollout.toml"
    config.write_text('[harness]\npreset = "python"\ncommand = ["./agentt.py", "{prompt}"]\n')
    proc = run(
        "rollout", "--config", str(config), "--task", '{"prompt": "hi"}', "--run-dir", str(tmp_path / "r")
    )
    assert proc.returncode == 2 and "harness.command[1]" in proc.stderr and "agentt.py" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_rollout_that_fails_to_start_leaves_no_temp_folder(tmp_path):
    """Without ``--run-dir`` the rollout's folder is a new one in the temp folder, kept for its logs;
    when the rollout fails before anything is written there (a missing engine script, found as the
    stack starts) the folder goes too. The control: a rollout that runs keeps its folder."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n\n'
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n'
    )
    env = {**os.environ, "TMPDIR": str(temp)}
    argv = [*HARNESSRL, "rollout", "--config", str(config), "--task", '{"prompt": "hi"}']
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2 and "replies.json" in proc.stderr
    assert list(temp.iterdir()) == []
    given = subprocess.run(
        [*argv, "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=120
    )
    assert given.returncode == 2 and not (tmp_path / "run").exists()  # nor the store in a folder given
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [kept] = temp.glob("harnessrl-rollout-*")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["log"].startswith(str(kept))


def test_controller_refuses_a_missing_harness_script_before_touching_the_store(tmp_path):
    config = tmp_path / "rollout.toml"
    config.write_text('[harness]\npreset = "python"\ncommand = ["./agentt.py", "{prompt}"]\n')
    store = tmp_path / "store.db"
    proc = run(
        "controller", "--config", str(config), "--store", str(store),
        "--gateway-url", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "c"),
    )  # fmt: skip
    assert proc.returncode == 2 and "harness.command[1]" in proc.stderr and "agentt.py" in proc.stderr
    assert not store.exists() and not (tmp_path / "c").exists()


def test_bad_config_file_is_named(tmp_path):
    proc = run("rollout", "--config", str(tmp_path / "missing.toml"), "--task", "{}")
    assert proc.returncode == 2
    assert "missing.toml" in proc.stderr and "does not exist" in proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[harness\n")
    proc = run("train", str(bad))
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr


def test_unknown_gateway_section_is_refused(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text("[gatewy]\nport = 1\n")
    proc = run("gateway", "--config", str(cfg))
    assert proc.returncode == 2 and "gatewy" in proc.stderr


def test_a_scripted_policy_beside_the_config_is_found_from_any_folder(tmp_path, monkeypatch):
    """``scripted:./x.json`` is the config file's, as a harness's ``./agent.py`` is; ``scripted:x.json``
    stays the working directory's (what ``--set engine.model=scripted:examples/...`` from the repo
    root means)."""
    from harnessrl.cli.rollout import load_rollout_config

    folder = tmp_path / "example"
    folder.mkdir()
    config = folder / "rollout.toml"
    config.write_text('[engine]\nmodel = "scripted:./replies.json"\n[harness]\ncommand = ["true"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_rollout_config(str(config), []).engine.model == f"scripted:{folder / 'replies.json'}"
    cwd_relative = load_rollout_config(str(config), ["engine.model=scripted:replies.json"])
    assert cwd_relative.engine.model == "scripted:replies.json"  # control: left as written
