"""What the local runner's sandbox needs of a rollout config, refused before anything starts by
``harnessrl rollout``, ``harnessrl controller`` and ``harnessrl data calibrate``
(``harnessrl.controller.stack.check_local_launch``):

- a gateway port below 1024: the sandbox's relay (an unprivileged user) cannot listen there, so every
  launch failed, an infrastructure failure of every attempt (``rollout`` exited 0; a ``controller``
  failed every queued rollout of a shared store);
- a ``harness.mounts`` entry that exposes the store (every task's ``hidden`` answers): the
  controller's ``--store`` and a ``sqlite://`` ``store.url`` were not checked, so the agent could read
  the answers of its own task.

The controller runs as a real process: a config it accepted would run until stopped, so each case
reads its first line of output (the banner of a controller that started) or its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from harnessrl.cli.main import app
from harnessrl.errors import ConfigError
from harnessrl.store import open_store

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root here")


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def rollout_config(tmp_path: Path, extra: str = "") -> Path:
    """A scripted engine, ``python -c pass`` as harness and ``true`` as evaluator: a rollout that
    starts accepted ends at once with reward 1."""
    (tmp_path / "replies.json").write_text(json.dumps({"turns": ["done"]}))
    config = tmp_path / "rollout.toml"
    config.write_text(
        f'[engine]\nmodel = "scripted:{tmp_path / "replies.json"}"\n\n'
        '[harness]\npreset = "python"\ncommand = ["-c", "pass"]\n' + extra + "\n"
        '[evaluator]\ntype = "command"\nreward_from = "exit_code"\ncommand = ["true"]\n'
    )
    return config


def refused(result: Result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for name in named:
        assert name in result.output, result.output


def run_controller(config: Path, store: Path, gateway_url: str, run_dir: Path) -> tuple[int | None, str]:
    """Start ``harnessrl controller``; return its exit status and output once it ended, or ``None`` and
    its banner if it started taking rollouts (then it is stopped)."""
    argv = [sys.executable, "-m", "harnessrl", "controller", "--config", str(config)]
    argv += ["--store", str(store), "--gateway-url", gateway_url, "--run-dir", str(run_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the banner of a started controller, or its error, or EOF
        if "taking queued rollouts" in first:
            return None, first
        rest, _ = proc.communicate(timeout=120)  # only ends a hung test
        return proc.returncode, first + rest
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)


@pytest.fixture
def shared_store(tmp_path: Path) -> Path:
    """The gateway's store, in a folder of its own."""
    store = tmp_path / "shared" / "harnessrl.db"
    store.parent.mkdir()
    open_store(str(store)).close()
    return store


def test_controller_refuses_a_mount_that_exposes_its_store(tmp_path, shared_store):
    for mount in (shared_store.parent, shared_store, Path(f"{shared_store}-wal")):
        if not mount.exists():
            mount.write_text("")
        config = rollout_config(tmp_path, f'mounts = ["{mount}"]\n')
        code, output = run_controller(config, shared_store, "http://127.0.0.1:45678", tmp_path / "c")
        assert code == 2, output
        assert "harness.mounts[0]" in output and "would expose" in output and "Traceback" not in output
        assert not (tmp_path / "c").exists()


def test_controller_refuses_a_gateway_port_the_sandbox_cannot_relay(tmp_path, shared_store):
    config = rollout_config(tmp_path)
    for url, named in (("http://127.0.0.1:80", "cannot listen below 1024"), ("ftp://127.0.0.1:45678", "ftp")):
        code, output = run_controller(config, shared_store, url, tmp_path / "c")
        assert code == 2, output
        assert "--gateway-url" in output and named in output and "Traceback" not in output
        assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("kubernetes", [False, True])
def test_rollout_refuses_a_gateway_port_below_1024(tmp_path, kubernetes):
    """With a [kubernetes] section too: it is the controller's, ``harnessrl rollout`` launches locally."""
    k8s = '\n[kubernetes]\ngateway_url = "http://10.0.0.1:8000"\nnetwork_policy = false\n'
    config = rollout_config(tmp_path, k8s if kubernetes else "")
    before = listing(tmp_path)
    result = CliRunner().invoke(
        app, ["rollout", "--config", str(config), "--task", '{"prompt": "x"}', "--run-dir", str(tmp_path / "r")]
        + ["--set", "gateway.port=80"],
    )  # fmt: skip
    refused(result, "gateway.port", "1024")
    assert listing(tmp_path) == before


def test_rollout_refuses_a_mount_that_exposes_a_sqlite_url_store(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    extra = f'mounts = ["{secret}"]\n\n[store]\nurl = "sqlite:///{secret / "x.db"}"\n'
    config = rollout_config(tmp_path, extra)
    before = listing(tmp_path)
    result = CliRunner().invoke(
        app, ["rollout", "--config", str(config), "--task", '{"prompt": "x"}', "--run-dir", str(tmp_path / "r")]
    )  # fmt: skip
    refused(result, "harness.mounts[0]", "would expose")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("exposed", [True, False])
def test_an_evaluator_mount_may_not_expose_the_controllers_store(tmp_path, shared_store, exposed):
    """The controller's ``--store`` (not the config's) against ``evaluator.mounts``: the scorer's
    sandbox runs the policy's code, so a mount of the store's folder there gave that code every
    task's hidden answers. The other folder is the control."""
    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.controller.stack import check_local_launch

    other = tmp_path / "other"
    other.mkdir()
    mount = shared_store.parent if exposed else other
    config = rollout_config(tmp_path)
    config.write_text(
        config.read_text().replace('command = ["true"]\n', f'command = ["true"]\nmounts = ["{mount}"]\n')
    )
    loaded = load_rollout_config(str(config), [])
    if exposed:
        with pytest.raises(ConfigError, match=r"evaluator\.mounts"):
            check_local_launch(loaded, str(shared_store), "--gateway-url", 8000)
    else:
        check_local_launch(loaded, str(shared_store), "--gateway-url", 8000)
