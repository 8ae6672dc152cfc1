"""Curating SWE-smith-style task sets: ``harnessrl data filter | calibrate | select | split``.

JSONL in, JSONL out, and a JSON report per step (``docs/data.md``). ``records`` reads and maps
records, ``curate`` holds the pure steps, ``calibrate`` runs rollouts (and imports the rollout stack
only when called).
"""

from harnessrl.data.curate import FILTER_RULES, filter_records, select_records, split_records
from harnessrl.data.records import iter_records, read_records, to_task, write_records

__all__ = [
    "FILTER_RULES",
    "filter_records",
    "iter_records",
    "read_records",
    "select_records",
    "split_records",
    "to_task",
    "write_records",
]
