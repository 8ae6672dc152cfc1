"""Rendering a harness spec: placeholders, env allow-list, and clear errors for bad config."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from harnessrl.controller.base import HarnessSpec
from harnessrl.controller.harness import check_harness, render_harness
from harnessrl.controller.presets import PRESETS, apply_preset
from harnessrl.errors import ConfigError
from harnessrl.schemas import Rollout


def rollout(**task):
    return Rollout(rollout_id="r-1", api_key="hrl-secret", task=task)


def test_placeholders_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESSRL_ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "host-secret")
    spec = HarnessSpec(
        command=["echo", "{prompt}", "${HOME}", "{task[n]}", '{"json": 1}'],
        env={"MY_URL": "{base_url}", "ROLL": "{rollout_id}"},
        files={"cfg/{rollout_id}.txt": "key={api_key}"},
    )
    r = render_harness(
        spec,
        rollout=rollout(prompt="add 2+2", n=3),
        workspace=tmp_path / "ws",
        base_url="http://127.0.0.1:9/rollouts/r-1/v1",
        anthropic_base_url="http://127.0.0.1:9/rollouts/r-1",
    )
    assert r.argv == ["echo", "add 2+2", "${HOME}", "3", '{"json": 1}']
    assert r.env["OPENAI_BASE_URL"] == r.env["MY_URL"] == "http://127.0.0.1:9/rollouts/r-1/v1"
    assert r.env["OPENAI_API_KEY"] == r.env["ANTHROPIC_API_KEY"] == "hrl-secret"
    assert r.env["HARNESSRL_ROLLOUT_ID"] == r.env["ROLL"] == "r-1"
    assert json.loads(r.env["HARNESSRL_TASK"]) == {"prompt": "add 2+2", "n": 3}
    assert json.loads(r.task_file.read_text()) == {"prompt": "add 2+2", "n": 3}
    assert r.files == {"cfg/r-1.txt": "key=hrl-secret"}
    # The admin key and unrelated host secrets never reach a harness.
    assert "admin-secret" not in json.dumps(r.env)
    assert "AWS_SECRET_ACCESS_KEY" not in r.env


def test_missing_task_field_names_it(tmp_path):
    spec = HarnessSpec(command=["echo", "{task[question]}"])
    with pytest.raises(ConfigError, match="question"):
        render_harness(
            spec, rollout=rollout(), workspace=tmp_path / "ws", base_url="u", anthropic_base_url="u"
        )


def test_missing_executable_is_reported_before_launch():
    with pytest.raises(ConfigError, match=r"harness.command\[0\].*no-such-harness"):
        check_harness(HarnessSpec(command=["no-such-harness", "-p", "x"]))


def test_empty_command_is_rejected():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        HarnessSpec(command=[])


def test_hidden_task_fields_never_reach_the_harness(tmp_path):
    spec = HarnessSpec(command=["echo", "{prompt}"], env={"T": "{task[repo]}"})
    r = render_harness(
        spec,
        rollout=rollout(prompt="fix it", repo="demo", hidden={"patch": "GOLD-PATCH-MARKER"}),
        workspace=tmp_path / "ws",
        base_url="u",
        anthropic_base_url="u",
    )
    seen = json.dumps([r.argv, r.env, r.files]) + r.task_file.read_text()
    assert "GOLD-PATCH-MARKER" not in seen
    assert json.loads(r.env["HARNESSRL_TASK"]) == {"prompt": "fix it", "repo": "demo"}
    with pytest.raises(ValueError, match="hidden"):  # refused when the spec is built: see below
        HarnessSpec(command=["echo", "{task[hidden]}"])


def test_repo_may_use_hidden_fields_and_only_the_repo(tmp_path):
    """The original repository's path (its history holds the fix) stays hidden: the controller
    copies it, the harness never learns where it is."""
    spec = HarnessSpec(command=["echo", "{task[name]}"], repo="{task[hidden.repo_path]}")
    r = render_harness(
        spec,
        rollout=rollout(name="demo", hidden={"repo_path": "/data/REPO-MARKER"}),
        workspace=tmp_path / "ws",
        base_url="u",
        anthropic_base_url="u",
    )
    assert r.repo == Path("/data/REPO-MARKER") and r.argv == ["echo", "demo"]
    assert "REPO-MARKER" not in json.dumps([r.argv, r.env, r.files]) + r.task_file.read_text()


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"command": ["echo", "{task[hidden.tests]}"]}, r"harness\.command\[1\]"),
        ({"command": ["echo"], "args": ["{task[hidden]}"]}, r"harness\.args\[0\]"),
        ({"command": ["echo"], "env": {"GOLD": "x{task[hidden.answer]}"}}, r"harness\.env\.GOLD"),
        ({"command": ["echo"], "files": {"a.txt": "{task[hidden.answer]}"}}, r"harness\.files\['a\.txt'\]"),
        ({"command": ["echo"], "files": {"{task[hidden.answer]}": ""}}, r"harness\.files"),
        ({"command": ["echo"], "workdir": "{task[hidden.dir]}"}, r"harness\.workdir"),
    ],
)
def test_hidden_fields_in_what_the_harness_sees_are_refused(fields, where):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=where + r": \{task\[hidden.*evaluator-only"):
        HarnessSpec(**fields)


def test_render_refuses_hidden_placeholders_and_visible_answers(tmp_path):
    # A spec built without validation (model_construct) still cannot render hidden data.
    spec = HarnessSpec.model_construct(
        **{**HarnessSpec(command=["echo"]).__dict__, "args": ["{task[hidden.a]}"]}
    )
    task = rollout(hidden={"a": "GOLD"})
    with pytest.raises(ConfigError, match=r"harness\.args\[0\]: \{task\[hidden\.a\]\} is evaluator-only"):
        render_harness(spec, rollout=task, workspace=tmp_path / "ws", base_url="u", anthropic_base_url="u")
    # A rollout created through the API with the answer at top level never launches.
    with pytest.raises(ConfigError, match="task field 'answer' is evaluator-only"):
        render_harness(
            HarnessSpec(command=["echo", "{prompt}"]),
            rollout=rollout(prompt="2+2?", answer="4"),
            workspace=tmp_path / "ws2",
            base_url="u",
            anthropic_base_url="u",
        )


def test_dotted_task_fields(tmp_path):
    spec = HarnessSpec(command=["echo", "{task[env.name]}", "{task[env]}"])
    r = render_harness(
        spec,
        rollout=rollout(env={"name": "lab"}),
        workspace=tmp_path / "ws",
        base_url="u",
        anthropic_base_url="u",
    )
    assert r.argv == ["echo", "lab", '{"name": "lab"}']
    with pytest.raises(ConfigError, match=r"harness\.command\[1\]: the task has no field 'env\.nope'"):
        render_harness(
            HarnessSpec(command=["echo", "{task[env.nope]}"]),
            rollout=rollout(env={"name": "lab"}),
            workspace=tmp_path / "ws2",
            base_url="u",
            anthropic_base_url="u",
        )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_no_preset_puts_the_rollout_key_in_argv(name, tmp_path):
    """A command line is visible to every local user (``ps``) for the whole rollout: the key goes in
    the environment. mini-swe-agent's preset used to pass ``model.model_kwargs.api_key=hrl-…``."""
    spec = apply_preset(HarnessSpec(preset=name, command=["agent.py"] if name == "python" else []))
    r = render_harness(
        spec,
        rollout=rollout(prompt="fix it"),
        workspace=tmp_path / "ws",
        base_url="http://127.0.0.1:9/rollouts/r-1/v1",
        anthropic_base_url="http://127.0.0.1:9/rollouts/r-1",
    )
    assert not any("hrl-secret" in arg for arg in r.argv), r.argv
    assert r.env["OPENAI_API_KEY"] == "hrl-secret"  # where litellm and the SDKs read it


@pytest.fixture
def no_project_harnesses(tmp_path, monkeypatch):
    """No ``.harnesses/`` (so the presets' config files go to the temp folder), and a temp folder of
    this test's own: the shared ``/tmp`` another local user could write to, in small."""
    monkeypatch.setenv("HARNESSRL_HARNESSES_DIR", str(tmp_path / "not-installed"))
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))  # the standard library's cache of TMPDIR
    return shared_tmp


def test_preset_config_in_the_temp_folder_is_private(no_project_harnesses):
    """Control: the folder is made, 0700 and ours, and holds the config the preset names."""
    spec = apply_preset(HarnessSpec(preset="qwen-code"))
    folder = no_project_harnesses / f"harnessrl-presets-{os.getuid()}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
    assert (folder / "qwen-code-settings.json").is_file()
    assert str(folder / "qwen-code-settings.json") in json.dumps(spec.model_dump())


@pytest.mark.parametrize("planted", ["symlink", "other_owner", "world_writable"])
def test_a_preset_folder_planted_by_someone_else_is_refused(no_project_harnesses, tmp_path, planted):
    """Another local user who made the temp folder's preset folder first (or a symlink to one of
    theirs) would choose the config every harness reads: its base URL, where the key goes."""
    folder = no_project_harnesses / f"harnessrl-presets-{os.getuid()}"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if planted == "symlink":
        folder.symlink_to(theirs)
    else:
        folder.mkdir(mode=0o700)
        if planted == "other_owner":
            if os.geteuid() != 0:
                pytest.skip("making a folder someone else's needs root")
            os.chown(folder, 65534, 65534)
        else:
            folder.chmod(0o777)
    with pytest.raises(ConfigError, match="not a private folder"):
        apply_preset(HarnessSpec(preset="qwen-code"))
    assert not (theirs / "qwen-code-settings.json").exists()
