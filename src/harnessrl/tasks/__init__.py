"""Task sources: where a run's tasks come from (JSONL files, reasoning-gym datasets).

Evaluators live in ``harnessrl.controller.evaluators``; dataset-specific scoring that an evaluator
runs lives beside the dataset here (reasoning-gym's, in a confined scorer process:
``harnessrl.tasks.reasoning_gym_scorer``). ``reasoning_gym`` is imported only by those modules, and
only when called: it takes seconds to import.
Imports go one way: the controller imports tasks, tasks never import the controller (what both
need, such as ``final_answer_text``, lives here, in ``harnessrl.tasks.answers``).
"""

from harnessrl.tasks.jsonl import load_tasks, save_tasks

__all__ = ["load_tasks", "save_tasks"]
