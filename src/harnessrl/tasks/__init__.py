"""Task sources: where a run's tasks come from (JSONL files, reasoning-gym datasets).

Evaluators live in ``harnessrl.controller.evaluators``; dataset-specific scoring that an evaluator
calls (reasoning-gym's ``score_answer``) lives beside the dataset here. ``reasoning_gym`` is imported
only by ``harnessrl.tasks.reasoning_gym``, and only when called: it takes seconds to import.
Imports go one way: the controller imports tasks, tasks never import the controller (what both
need, such as ``final_answer_text``, lives here, in ``harnessrl.tasks.answers``).
"""

from harnessrl.tasks.jsonl import load_tasks, save_tasks

__all__ = ["load_tasks", "save_tasks"]
