"""Load a ``benchmarks/`` script as a module, for the tests of its pure helpers (benchmarks/ is not a
package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(stem: str) -> ModuleType:
    """``benchmarks/<stem>.py`` as the module ``<stem>_benchmark``, registered in ``sys.modules``
    (dataclasses resolve their annotations through it)."""
    spec = importlib.util.spec_from_file_location(f"{stem}_benchmark", BENCHMARKS / f"{stem}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
