"""``harnessrl sft`` as a user runs it: a config naming a recorded run folder, a checkpoint that
``harnessrl train`` can start from, ``--export-jsonl``, ``--resume``, and bad input named clearly
(exit 2, one line naming the field)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from harnessrl.cli.main import app

runner = CliRunner()


def write_config(tmp_path: Path, teacher: Path, **select: object) -> Path:
    lines = [
        "[run]",
        'name = "student"',
        "[source]",
        f'run_dir = "{teacher}"',
        "[select]",
        *(f"{k} = {json.dumps(v)}" for k, v in select.items()),
        "[sft]",
        'model = "tiny"',
        "epochs = 2",
        "sequences_per_step = 2",
        "[metrics]",
        "tensorboard = false",
        "progress = false",
    ]
    path = tmp_path / "sft.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_sft_trains_a_checkpoint_train_starts_from(record, solving, tmp_path):
    rec = record([solving, solving, solving], [1.0, 0.0, 1.0])
    config = write_config(tmp_path, rec.run_dir)
    result = runner.invoke(app, ["sft", str(config)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["rollouts"] == 2 and summary["sequences"] == 2 and summary["steps"] == 2
    latest = Path(summary["checkpoint"])
    assert (latest / "config.json").is_file() and (latest / "chat_template.jinja").is_file()
    rows = [json.loads(line) for line in (tmp_path / "runs/student/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["sft/loss"] > 0 for r in rows)
    data = json.loads((tmp_path / "runs/student/sft_data.json").read_text())
    assert data["rollouts_dropped"] == {"below_reward": 1}

    # train's starting weights: engine.model names a model folder (engines.models.resolve_model_dir)
    from harnessrl.engines.models import resolve_model_dir

    assert resolve_model_dir(str(latest)) == latest
