"""``harnessrl sft``: validate the config before importing torch, then fine-tune (``sft.run``) or,
with ``--export-jsonl``, write the selected conversations and stop (no model is loaded)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harnessrl.sft.run import SftRun, prepare_sft_run


def run_sft(
    config_path: str | None, resume: str | None, overrides: list[str], export_jsonl: str | None = None
) -> dict[str, Any]:
    config, run_dir = prepare_sft_run(config_path, resume, overrides)
    if export_jsonl is not None:
        from harnessrl.sft.data import export_conversations

        return export_conversations(config, Path(export_jsonl))
    print(
        f"harnessrl: sft {'resuming' if resume else 'training'} in {run_dir} (loading the model...)",
        file=sys.stderr,
    )
    from harnessrl.cli.train import quiet_third_party_bars

    quiet_third_party_bars()
    summary = SftRun(config, run_dir, resume=bool(resume)).run()
    print(
        f"harnessrl: done; metrics {run_dir / 'metrics.jsonl'}, data report {run_dir / 'sft_data.json'}\n"
        f'  RL from it: set engine.model = "{run_dir / "checkpoints" / "final"}" in a train config',
        file=sys.stderr,
    )
    return summary
