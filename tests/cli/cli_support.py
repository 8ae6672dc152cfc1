"""What the in-process CLI tests share: running a command with typer's ``CliRunner``, the check that a
bad input was refused (exit 2, the named fields, no traceback), and a folder's listing (to show that
nothing was half-created)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner, Result

from harnessrl.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny" / "train.toml"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def refused(result: Result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    for name in named:
        assert name in result.output, result.output


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
