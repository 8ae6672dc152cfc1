"""Checks of a coding task verified outside the process that runs the code under test: probes.

Most HumanEval checks have the shape ``assert candidate(ARGS) == EXPECTED``; ``checks`` gives each
such check a *probe*, a function returning what the call returns. At build time the probes run
against the gold solution and their values are recorded (``repr``, read back with
``ast.literal_eval``) in the task's hidden folder (``scoring.json``). At scoring time
``run_probes`` starts one child (``probe_child.py``, through ``run_scored``) that imports the
function under test from the workspace's ``solution.py`` (that name alone: the helpers the probes
call are the prompt's, stored in ``scoring.json``) and prints what each probe returns; ``verdicts``
compares those values with the recorded ones here, in the scorer. The child never sees the expected values (they stay in
the hidden folder, outside its domain) nor the hidden tests (restored into the workspace only after
it is dead), so no rewrite of pytest, of the child, or of its output gives a matching value: only
computing it.

Checks of other shapes (loops, ``abs(x - y) < 1e-6``) and probes whose gold value is not a literal
(``float('inf')``, an object) have no recorded value: pytest alone judges them (``pytest_scoring``).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harnessrl.tasks.coding.checks import SOLUTION_FILE, TEST_FILE, SplitChecks
from harnessrl.tasks.scored_child import child_env, run_child

SCORING_FILE = "scoring.json"  # in the hidden folder: the scorer's metadata and expected values
FORMAT = 2  # 2: the function under test is imported by name, helpers come from the spec
_MAX_REPR = 16 << 10  # characters of one value's repr: bigger values are not recorded or accepted
_LINE_LIMIT = _MAX_REPR + 1024
_CHILD = Path(__file__).with_name("probe_child.py")


@dataclass(frozen=True)
class Probe:
    name: str  # the test function it mirrors, e.g. test_check_03
    source: str  # ``def __probe__(): ...``
    expected: str | None = None  # the gold value's repr; None: not recorded (pytest alone judges)

    @property
    def test_id(self) -> str:
        return f"{TEST_FILE}::{self.name}"


@dataclass(frozen=True)
class ProbeSpec:
    """What the probe child needs (no expected values) plus the expected values (the scorer's)."""

    module: str
    entry_point: str  # the one name the probes take from ``module``
    helpers: str  # the prompt's helpers the checks call: a trusted copy, never the module's
    prelude: str
    uses_random: bool
    probes: tuple[Probe, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "test_file": TEST_FILE,
            "module": self.module,
            "entry_point": self.entry_point,
            "helpers": self.helpers,
            "prelude": self.prelude,
            "uses_random": self.uses_random,
            "probes": [{"test": p.name, "source": p.source, "expected": p.expected} for p in self.probes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeSpec:
        if data.get("format") != FORMAT:
            raise ValueError(f"unknown {SCORING_FILE} format {data.get('format')!r}")
        probes = tuple(Probe(p["test"], p["source"], p.get("expected")) for p in data["probes"])
        return cls(
            str(data["module"]),
            str(data["entry_point"]),
            str(data["helpers"]),
            str(data["prelude"]),
            bool(data["uses_random"]),
            probes,
        )

    def recorded(self) -> tuple[Probe, ...]:
        return tuple(p for p in self.probes if p.expected is not None)


def spec_for(split: SplitChecks) -> ProbeSpec:
    """The probes of ``split``'s tests, no values recorded yet."""
    probes = tuple(Probe(t.name, t.probe) for t in split.tests if t.probe)
    module = SOLUTION_FILE.removesuffix(".py")
    return ProbeSpec(module, split.entry_point, split.helpers, split.prelude, split.uses_random, probes)


@dataclass(frozen=True)
class ProbeRun:
    values: dict[str, tuple[str, str]]  # probe name -> (status, value): untrusted
    exit_code: int | None
    timed_out: bool
    isolation: str
    leftovers: int


def run_probes(
    workspace: Path,
    probes: Sequence[Probe],
    spec: ProbeSpec,
    *,
    timeout_s: float,
    per_probe_s: float = 10.0,
    isolated: bool = True,
) -> ProbeRun:
    """Run ``probes`` against ``workspace``'s module in one child; what it says each returns. Only
    names and sources go to the child, never ``expected``."""
    request = {
        "module": spec.module,
        "entry_point": spec.entry_point,
        "helpers": spec.helpers,
        "prelude": spec.prelude,
        "uses_random": spec.uses_random,
        "timeout_s": min(per_probe_s, timeout_s),
        "max_repr": _MAX_REPR,
        "probes": [{"name": p.name, "source": p.source} for p in probes],
    }
    run = run_child(
        [sys.executable, "-I", "-B", "-c", _CHILD.read_text()],
        cwd=workspace,
        env=child_env(Path("/tmp")),
        timeout_s=timeout_s,
        stdin=json.dumps(request).encode(),
        isolated=isolated,
        output_limit=(len(probes) + 1) * _LINE_LIMIT,
    )
    names = {p.name for p in probes}
    values: dict[str, tuple[str, str]] = {}
    duplicates: set[str] = set()
    for line in run.output.splitlines():
        row = _row(line)
        if row is None or row[0] not in names:
            continue
        if row[0] in values:
            duplicates.add(row[0])  # two answers for one probe: neither counts
        values[row[0]] = row[1:]
    for name in duplicates:
        values[name] = ("duplicate", "")
    return ProbeRun(values, run.exit_code, run.timed_out, run.isolation, run.leftovers)


def _row(line: bytes) -> tuple[str, str, str] | None:
    if len(line) > _LINE_LIMIT:
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    name, status, value = row.get("name"), row.get("status"), row.get("value")
    if not (isinstance(name, str) and isinstance(status, str) and isinstance(value, str)):
        return None
    return name, status, value


def literal(text: str) -> tuple[bool, Any]:
    """``(True, value)`` when ``text`` is a bounded Python literal, else ``(False, None)``."""
    if len(text) > _MAX_REPR:
        return False, None
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def matches(status: str, value: str, expected: str) -> bool:
    """Whether a probe's reported value equals the expected one (``==``, as the test's assert)."""
    if status != "returns":
        return False
    ok, got = literal(value)
    ok_expected, want = literal(expected)
    if not (ok and ok_expected):
        return False
    try:
        return bool(got == want)
    except (RecursionError, MemoryError):
        return False


def verdicts(run: ProbeRun, probes: Sequence[Probe]) -> dict[str, bool]:
    """Test id -> whether the code's value equals the recorded one, for every recorded probe."""
    out = {}
    for probe in probes:
        assert probe.expected is not None
        status, value = run.values.get(probe.name, ("missing", ""))
        out[probe.test_id] = matches(status, value, probe.expected)
    return out


def record(
    gold: Path, spec: ProbeSpec, *, timeout_s: float, per_probe_s: float = 10.0
) -> tuple[ProbeSpec, list[str]]:
    """Run every probe against the gold solution in ``gold`` (trusted: a plain child) and record the
    values that read back as equal literals; returns the spec and the names left unrecorded."""
    run = run_probes(gold, spec.probes, spec, timeout_s=timeout_s, per_probe_s=per_probe_s, isolated=False)
    probes, skipped = [], []
    for probe in spec.probes:
        status, value = run.values.get(probe.name, ("missing", ""))
        ok, parsed = literal(value) if status == "returns" else (False, None)
        if ok and _equal_to_itself(parsed):
            probes.append(Probe(probe.name, probe.source, value))
        else:
            probes.append(Probe(probe.name, probe.source, None))
            skipped.append(probe.name)
    return dataclasses.replace(spec, probes=tuple(probes)), skipped


def _equal_to_itself(value: Any) -> bool:
    try:
        return bool(value == value)  # nan (inside a tuple, say) never matches: not recordable
    except (RecursionError, MemoryError):
        return False


def drop(spec: ProbeSpec, names: set[str]) -> ProbeSpec:
    """``spec`` with the values of ``names`` no longer recorded (pytest alone judges those)."""
    probes = tuple(Probe(p.name, p.source, None) if p.name in names else p for p in spec.probes)
    return dataclasses.replace(spec, probes=probes)


def load(hidden: Path) -> ProbeSpec:
    return ProbeSpec.from_json(json.loads((hidden / SCORING_FILE).read_text(encoding="utf-8")))
