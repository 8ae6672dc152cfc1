"""Tripwires: tests a scorer appends to a test suite, one that must fail and one that must pass, with
fresh random names shaped like the suite's own (``test_check_41`` beside ``test_check_03``).

Code under test that rewrites pytest's verdict from inside its process without knowing about them
gets them wrong: a must-fail one passes, or one is missing from a forged report
(``pytest_scoring.verdict_flags``). Code that reads the test file at run time can tell them apart
(their bodies compare two constants): docs/evaluators.md has the residual risk.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_HEAD = "\n\n\n"


@dataclass(frozen=True)
class Tripwire:
    test_id: str
    must_pass: bool


def _own_file(workspace: Path, rel: str) -> Path | None:
    """``workspace/rel`` if it is a regular file reached without links, else None."""
    path = workspace / rel
    real = os.path.realpath(path)
    if real != os.path.join(os.path.realpath(workspace), os.path.normpath(rel)) or path.is_symlink():
        return None
    return path if path.is_file() else None


def _function_name(test_id: str) -> str:
    return test_id.partition("[")[0].split("::")[-1]


def _tripwire_names(source: str, listed: list[str], rng: random.Random) -> tuple[str, str]:
    """Two fresh names shaped like the file's listed tests: ``test_check_07`` beside ``test_check_03``."""
    taken = set(re.findall(r"\b(?:def|class)\s+(\w+)", source))
    prefix = os.path.commonprefix(listed) if listed else ""
    prefix = prefix[: prefix.rfind("_") + 1] if "_" in prefix else ""
    if not prefix or not prefix.isidentifier():
        prefix = "test_"
    tails = [n[len(prefix) :] for n in listed]
    width = len(tails[0]) if tails and all(t.isdigit() and len(t) == len(tails[0]) for t in tails) else 0
    names: list[str] = []
    while len(names) < 2:
        if width and len(names) + len(taken) < 10**width // 2:
            tail = str(rng.randrange(10**width)).zfill(width)
        else:
            tail = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
        name = prefix + tail
        if name not in taken and name not in names:
            names.append(name)
    return names[0], names[1]


def plant_tripwires(
    workspace: Path, test_ids: Sequence[str], rng: random.Random | None = None
) -> list[Tripwire]:
    """Append a must-fail and a must-pass test to each file holding one of ``test_ids``."""
    rng = rng or random.SystemRandom()
    by_file: dict[str, list[str]] = {}
    for test_id in test_ids:
        by_file.setdefault(test_id.split("::", 1)[0], []).append(_function_name(test_id))
    planted = []
    for rel, names in sorted(by_file.items()):
        path = _own_file(workspace, rel)
        if path is None:
            continue  # deleted or replaced by a link: its tests go missing, which scores 0
        source = path.read_bytes().decode(errors="replace")
        fail, ok = _tripwire_names(source, names, rng)
        a, b = rng.sample(range(100, 1000), 2)
        code = f"{_HEAD}def {fail}():\n    assert {a} == {b}\n\n\ndef {ok}():\n    assert {a} == {a}\n"
        with path.open("ab") as fh:
            fh.write(code.encode())
        planted += [Tripwire(f"{rel}::{fail}", False), Tripwire(f"{rel}::{ok}", True)]
    return planted
