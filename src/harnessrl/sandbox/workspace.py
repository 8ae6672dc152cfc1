"""Per-rollout workspaces: copy the task's repository, hide its git history, place harness files.

Hiding history is a reward-hacking defense: agents have found the gold patch in ``git log``. Modes:
``remove`` deletes ``.git``; ``squash`` (default) replaces it with a fresh repository holding one
commit of the current tree, so ``git diff``/``git status`` still work for the agent; ``keep`` leaves
it (for harnesses that need history and tasks that have none to leak).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harnessrl.errors import ConfigError

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "harnessrl",
    "GIT_AUTHOR_EMAIL": "harnessrl@localhost",
    "GIT_COMMITTER_NAME": "harnessrl",
    "GIT_COMMITTER_EMAIL": "harnessrl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/nonexistent",
}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=_GIT_ENV, check=True, capture_output=True)


def hide_git_history(repo: Path, mode: str) -> None:
    git_dir = repo / ".git"
    if mode == "keep" or not git_dir.exists():
        return
    if git_dir.is_dir():
        shutil.rmtree(git_dir)
    else:  # a worktree/submodule pointer file: it points at the real history
        git_dir.unlink()
    if mode == "squash":
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", "task snapshot")


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700: run folders hold the store, every task with its
    hidden data, and the rollouts' keys; only the controller's user may enter them."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def prepare_workspace(
    workspace: Path, *, repo: Path | None, files: dict[str, str], git_history: str = "squash"
) -> None:
    """Fill an empty ``workspace``: the repo's tree (history hidden per ``git_history``), then ``files``."""
    workspace.mkdir(parents=True, exist_ok=True)
    if repo is not None:
        if not repo.is_dir():
            raise ConfigError(f"harness.repo: {str(repo)!r} is not a folder")
        shutil.copytree(repo, workspace, symlinks=True, dirs_exist_ok=True)
        hide_git_history(workspace, git_history)
    for rel, content in files.items():
        target = (workspace / rel).resolve()
        if not target.is_relative_to(workspace.resolve()):
            raise ConfigError(f"harness.files: {rel!r} points outside the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
