"""SWE-smith-style task records: reading and writing JSONL, and mapping a record to a harnessrl task.

A *record* is one raw line of a task set as SWE-smith publishes it (``instance_id``,
``problem_statement``, ``image_name``, ``repo``, ``base_commit``, ``FAIL_TO_PASS``,
``PASS_TO_PASS``, ``patch``...). The curation commands keep records as they are and only add fields
(``calibration``), so a curated file can still be fed to SWE-smith's own tools. ``to_task`` is the one
place that says how a record becomes the task data a harness sees (``docs/data.md`` has the table).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import unicodedata
from collections.abc import Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from harnessrl.errors import ConfigError, HarnessRLError
from harnessrl.tasks.fields import EVALUATOR_ONLY, HIDDEN

Record = dict[str, Any]

# Fields the pipeline adds; ``to_task`` leaves them out of what the harness sees.
PIPELINE_FIELDS = ("calibration",)
# The test lists, decoded; like every other evaluator-only field they go under task["hidden"].
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")


def read_records(path: str | Path) -> list[Record]:
    """All records of a JSONL file (blank lines skipped); errors name the file and line.

    Lines end at ``"\n"`` only (``"\r\n"`` read as one): ``str.splitlines`` would also split at
    U+2028, U+2029, U+0085 and other separators, which ``write_records`` writes raw inside strings."""
    return list(iter_records(path))


def iter_records(path: str | Path) -> Iterator[Record]:
    """``read_records`` one record at a time, the file read a line at a time: a command that keeps
    few of them (``filter``) holds those, not the file. Reading the whole file first held its bytes,
    their lines and the records at once: three times a 2 GB export."""
    yield from _records_of(path, torn_tail=False)


def read_appended_records(path: str | Path, *, torn_tail: bool = True) -> tuple[list[Record], bool]:
    """``read_records`` for a file written by ``append_record``: with ``torn_tail``, a last line
    without its newline that is not a JSON object (an append cut short: the process killed, the
    disk full) is left out, and the second value says so; any other bad line is an error.

    Each line is decoded on its own: an append cut inside a character (a record's non-ASCII text is
    written raw) is a torn last line like any other, where decoding the whole file refused it and
    with it every resume; a line that is not UTF-8 anywhere else is an error naming it."""
    records: list[Record] = []
    torn = _drain(records, _records_of(path, torn_tail=torn_tail))
    return records, torn


def _drain(records: list[Record], source: Generator[Record, None, bool]) -> bool:
    """Append what ``source`` yields to ``records``; returns what it returns."""
    while True:
        try:
            records.append(next(source))
        except StopIteration as stop:
            return bool(stop.value)


def _records_of(path: str | Path, *, torn_tail: bool) -> Generator[Record, None, bool]:
    """The records of ``path`` as ``read_appended_records`` reads them; returns whether a torn last
    line was left out."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                # A file saved by a Windows tool (PowerShell's Out-File, Notepad) starts with a UTF-8
                # byte order mark: line 1 was refused ("Unexpected UTF-8 BOM"), and with it the file.
                raw = raw.removeprefix(codecs.BOM_UTF8) if lineno == 1 else raw
                last = not raw.endswith(b"\n")  # only the file's last line lacks its newline
                record = _record_of(path, lineno, raw.removesuffix(b"\n"), torn_tail and last)
                if record is _TORN:
                    return True
                if record is not None:
                    yield record
    except OSError as exc:
        raise ConfigError(f"data: cannot read {path}: {exc}") from exc
    return False


_TORN: Record = {}  # ``_record_of``'s answer for a torn last line (compared by identity)


def _record_of(path: Path, lineno: int, raw: bytes, may_be_torn: bool) -> Record | None:
    """One line's record; None for a blank line; ``_TORN`` for a torn last line (``may_be_torn``)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if may_be_torn:  # cut inside a character
            return _TORN
        raise ConfigError(f"data: {path}:{lineno}: not UTF-8 text: {exc}") from exc
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except ValueError as exc:
        if may_be_torn:  # the last line, not ended by "\n": cut short
            return _TORN
        raise ConfigError(f"data: {path}:{lineno}: not valid JSON: {exc}") from exc
    except RecursionError:  # [[[[...: json's decoder recurses once per level
        raise ConfigError(f"data: {path}:{lineno}: nested too deeply to read") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"data: {path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    return obj


#: A lone UTF-16 surrogate: JSON's ``"\\ud800"`` escape reads back as one, which UTF-8 cannot encode.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def json_line(record: Record) -> str:
    """One record as a JSONL line (non-ASCII written as is). A lone surrogate (a string of the input
    held the escape ``"\\ud800"``, which JSON allows and ``json.loads`` reads) is written as that
    escape again: written raw, UTF-8 refused it and every command ended in a traceback."""
    line = json.dumps(record, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", line) + "\n"


def write_records(path: str | Path, records: Iterable[Record]) -> Path:
    """Write records as JSONL atomically (a reader, or a resumed run, never sees half a file)."""
    [written] = write_files({Path(path): map(json_line, records)})
    return written


def write_files(files: Mapping[Path, Iterable[str]]) -> list[Path]:
    """Write each file's text to a temp file beside it, synced to disk, then move them all into place:
    a reader never sees half a file, and an error writing any of them (a full disk, a file size
    limit) leaves every file as it was and no temp file behind (``split`` wrote its train set, then
    failed on the test set: a new train set beside the old test set, records on both sides). The
    error is a ``HarnessRLError`` naming the file, not a traceback."""
    staged: list[tuple[Path, Path]] = []
    path = Path()
    try:
        for path, chunks in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staged.append((tmp, path))
            with tmp.open("w", encoding="utf-8") as fh:
                fh.writelines(chunks)
                fh.flush()
                os.fsync(fh.fileno())
        for tmp, path in staged:
            os.replace(tmp, path)
    except OSError as exc:
        raise HarnessRLError(f"data: cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)  # moved into place, else left over by the error
    return [path for _, path in staged]


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one file: a hard link or symlink to it, or (one of them not
    written yet) the same resolved path."""
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return a.samefile(b)
    return a.resolve() == b.resolve()


def append_record(path: str | Path, record: Record) -> None:
    """Append one record and flush it to disk: what a killed ``calibrate`` has finished survives.

    A last line without its newline (a run killed after writing a record, before its ``"\n"``)
    reads back whole, so nothing rewrites it: the record appended after it went on the same line,
    neither read back any more, and every resume stopped at that line. It gets its newline first."""
    with Path(path).open("a+b") as fh:
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                fh.write(b"\n")
        fh.write(json_line(record).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())


def write_report(path: str | Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        write_files({Path(path): [json.dumps(report, indent=2) + "\n"]})


def instance_id(record: Record) -> str:
    value = record.get("instance_id")
    return value.strip() if isinstance(value, str) else ""


def text_field(record: Record, name: str) -> str:
    """A string field, stripped; anything missing or not a string counts as empty."""
    value = record.get(name)
    return value.strip() if isinstance(value, str) else ""


def tests_of(record: Record, name: str) -> list[str]:
    """``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as a list: the record's own field, else the one in its
    ``hidden`` object (a record already in task form). Hugging Face exports of SWE-bench-style sets
    store them as JSON-encoded strings (``'["tests/test_a.py::test_x"]'``); both shapes are read,
    and JSON ``null`` (``None`` or ``"null"``) is no tests.

    A JSON-encoded string nested too deeply to decode (``"[[[[..."``: json's decoder recurses once
    per level) is a ``ConfigError`` naming the record and the field; it was a ``RecursionError``
    traceback out of ``filter``, ``calibrate`` and a training run's task loading."""
    value = record.get(name)
    hidden = record.get(HIDDEN)
    if name not in record and isinstance(hidden, dict):
        value = hidden.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except ValueError:
            return [value]  # a single test id written as a bare string
        except RecursionError:
            raise ConfigError(
                f"data: record {instance_id(record)!r}: {name} is a JSON string nested too deeply to read"
            ) from None
    if value is None:
        return []
    if isinstance(value, list):
        return [str(item) for item in value]
    return [str(value)]


def count_tests(record: Record) -> int:
    return len(tests_of(record, "FAIL_TO_PASS")) + len(tests_of(record, "PASS_TO_PASS"))


def branch_ref(record: Record) -> str:
    """The code reference the task's repository is checked out at: ``branch`` if given, else
    ``base_commit`` (SWE-smith also names each task's branch after its ``instance_id`` in the
    mirror repository, but a record without either field cannot be reproduced from itself)."""
    return text_field(record, "branch") or text_field(record, "base_commit")


_SPACE = re.compile(r"\s+")


def normalized_statement(record: Record) -> str:
    """Case-folded, whitespace-collapsed problem statement: near-identical rewrites of one issue.

    Unicode forms count as one too (NFKC: a composed and a decomposed "é", a full-width letter, a
    no-break space), and invisible format characters (a zero-width space, a BOM, a soft hyphen)
    are dropped: copies of one statement that differed only there were two tasks to ``filter
    --dedupe-statements`` and to ``split``, which could put them on both sides."""
    text = unicodedata.normalize("NFKC", text_field(record, "problem_statement"))
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    # casefold can undo NFKC (it turns U+01F0 into "j" plus a combining caron): normalize again
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", visible.casefold())).strip()


def repo_of(record: Record) -> str:
    """The project a record belongs to, as ``owner__name`` (case-folded), whatever form ``repo`` has:
    SWE-smith's mirror ``swesmith/owner__name.commit`` (the commit suffix dropped: two snapshots of
    one project are one project), SWE-bench's and SWE-Gym's ``owner/name``, a GitHub URL. A set
    mixing them kept ``django__django`` and ``django/django`` apart, and ``split --no-repo-leakage``
    put one project on both sides."""
    repo = text_field(record, "repo")
    if not repo:
        return ""
    parts = [part for part in repo.split("/") if part]
    if not parts:  # "/": no name to read, itself its own project
        return repo
    name = parts[-1] if "__" in parts[-1] else "__".join(parts[-2:])
    # Everything from the first dot goes (the mirror's commit, ".git"); owners hold no dots. Two
    # projects differing only there ("pdf.js", "pdf.py") are one here: too coarse never leaks.
    return name.split(".", 1)[0].casefold()


def to_task(record: Record) -> dict[str, Any]:
    """The task data for a record: what a harness sees (``{prompt}``, ``{task[FIELD]}``) and, under
    ``hidden``, what only evaluators and ``harness.repo`` see (``{task[hidden.FIELD]}``).

    Every original field is kept (``{task[image_name]}``, ``{task[repo]}`` work as written) and
    ``prompt``/``task_id``/``branch`` are added. Every evaluator-only field
    (``harnessrl.tasks.fields.EVALUATOR_ONLY``: ``patch``, ``test_patch``, the test lists, decoded to
    lists, ``answer``...) moves under ``hidden``, merged with the record's own ``hidden`` object (a
    top-level field wins over the same name there; the test lists of a ``hidden`` object are kept
    when the record has none of its own). A ``hidden`` that is not an object is a ``ConfigError``.
    """
    own = record.get(HIDDEN)
    if own is not None and not isinstance(own, dict):  # dict("abc") raised, dict([["a", 1]]) "worked"
        raise ConfigError(
            f"data: record {instance_id(record)!r}: 'hidden' must be a JSON object, got {type(own).__name__}"
        )
    task = {k: v for k, v in record.items() if k not in PIPELINE_FIELDS and k not in EVALUATOR_ONLY}
    hidden = dict(own or {})
    hidden.update({k: v for k, v in record.items() if k in EVALUATOR_ONLY})
    hidden.update({name: tests_of(record, name) for name in TEST_LISTS})
    task[HIDDEN] = hidden
    task.update(
        {
            "task_id": instance_id(record),
            "prompt": text_field(record, "problem_statement"),
            "branch": branch_ref(record),
        }
    )
    return task
