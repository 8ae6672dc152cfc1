"""Bad input to ``harnessrl sft`` that used to end in a traceback (exit 1): each is now exit 2 with
one line naming the field or option, and nothing left behind (no run folder, no half export)."""

from __future__ import annotations

import pytest
from tests.sft.test_cli import write_config
from typer.testing import CliRunner

from harnessrl.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("name", ["tools", "messages", "add_generation_prompt"])
def test_a_reserved_template_variable_is_refused_naming_the_field(record, solving, tmp_path, name):
    """``sft.chat_template_kwargs = {tools = 1}`` reached ``render_chat(..., tools=..., **kwargs)``:
    a ``TypeError`` once the model had loaded."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    result = runner.invoke(app, ["sft", str(config), "--set", f"sft.chat_template_kwargs={{{name} = 1}}"])
    assert result.exit_code == 2, result.output
    assert "sft.chat_template_kwargs" in result.output and name in result.output
    assert not (tmp_path / "runs").exists()
    # control: a variable the template may read is the template's to use
    ok = runner.invoke(
        app, ["sft", str(config), "--set", "sft.chat_template_kwargs={enable_thinking = true}"]
    )
    assert ok.exit_code == 0, ok.output


def test_an_unusable_model_cache_is_named(record, solving, tmp_path):
    """``sft.cache_dir`` that cannot be created ended in a ``FileNotFoundError`` traceback; an
    unknown ``sft.model`` was refused without naming the field."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    result = runner.invoke(app, ["sft", str(config), "--set", f'sft.cache_dir="{blocker}/cache"'])
    assert result.exit_code == 2, result.output
    assert "sft.cache_dir" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()
    result = runner.invoke(app, ["sft", str(config), "--set", 'sft.model="no-such-model"'])
    assert result.exit_code == 2 and "sft.model: unknown model 'no-such-model'" in result.output
    assert not (tmp_path / "runs").exists()


def test_an_export_that_cannot_be_written_is_named_and_leaves_nothing(record, solving, tmp_path):
    """A write that fails (here: its temporary file's name is a folder) ended in a traceback."""
    rec = record([solving], [1.0])
    config = write_config(tmp_path, rec.run_dir)
    out = tmp_path / "out.jsonl"
    (tmp_path / "out.jsonl.tmp").mkdir()
    result = runner.invoke(app, ["sft", str(config), "--export-jsonl", str(out)])
    assert result.exit_code == 2, result.output
    assert "--export-jsonl: cannot write" in result.output and not out.exists()
    (tmp_path / "out.jsonl.tmp").rmdir()  # control: the same export, writable
    result = runner.invoke(app, ["sft", str(config), "--export-jsonl", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text().count("\n") == 1
