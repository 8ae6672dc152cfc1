"""Workspaces: the task repo is copied with its history hidden, files are placed, escapes refused."""

from __future__ import annotations

import subprocess

import pytest

from harnessrl.errors import ConfigError
from harnessrl.sandbox.workspace import prepare_workspace

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def git(cwd, *args) -> str:
    import os

    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    ).stdout


@pytest.fixture
def repo_with_gold_patch(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "fix.py").write_text("def f():\n    return 'GOLD PATCH'\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the fix")
    (repo / "fix.py").write_text("def f():\n    return 'bug'\n")
    git(repo, "commit", "-q", "-am", "reintroduce the bug")
    return repo


def test_squash_leaves_one_commit_without_the_gold_patch(tmp_path, repo_with_gold_patch):
    ws = tmp_path / "ws"
    prepare_workspace(ws, repo=repo_with_gold_patch, files={}, git_history="squash")
    log = git(ws, "log", "--oneline")
    assert len(log.strip().splitlines()) == 1
    assert "GOLD PATCH" not in git(ws, "log", "-p", "--all")
    assert (
        "GOLD PATCH"
        not in subprocess.run(["grep", "-r", "GOLD PATCH", str(ws)], capture_output=True, text=True).stdout
    )
    assert git(ws, "status", "--porcelain") == ""


def test_remove_deletes_history(tmp_path, repo_with_gold_patch):
    ws = tmp_path / "ws"
    prepare_workspace(ws, repo=repo_with_gold_patch, files={}, git_history="remove")
    assert not (ws / ".git").exists()
    assert (ws / "fix.py").read_text().endswith("'bug'\n")


def test_keep_keeps_history(tmp_path, repo_with_gold_patch):
    ws = tmp_path / "ws"
    prepare_workspace(ws, repo=repo_with_gold_patch, files={}, git_history="keep")
    assert "GOLD PATCH" in git(ws, "log", "-p")


def test_files_are_placed_and_cannot_escape(tmp_path):
    ws = tmp_path / "ws"
    prepare_workspace(ws, repo=None, files={"a/b.txt": "hello"})
    assert (ws / "a" / "b.txt").read_text() == "hello"
    with pytest.raises(ConfigError, match="outside the workspace"):
        prepare_workspace(tmp_path / "ws2", repo=None, files={"../evil.txt": "x"})
