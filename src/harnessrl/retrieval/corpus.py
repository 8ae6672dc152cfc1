"""A retrieval corpus on disk: one passage a JSON line, read once and fingerprinted by its bytes.

Two layouts are read: ``{"id", "title", "text"}`` (harnessrl's, what ``tasks.search`` writes) and
Search-R1's / FlashRAG's ``{"id", "contents"}`` where ``contents`` is ``"Title"\\ntext`` (the wiki-18
dump the Search-R1 paper retrieves from). The fingerprint names the index built from the corpus, so
an index is rebuilt exactly when the corpus's content, the index layout or the tantivy release changes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import ConfigError

#: Bumped when the index layout or its analyzers change, so old cached indexes are not reused.
INDEX_LAYOUT = "tantivy-v1-en_stem"


def index_layout() -> str:
    """``INDEX_LAYOUT`` and the installed tantivy release: another release may tokenize or store an
    index differently, so an upgrade builds a new index instead of searching one it did not write."""
    return f"{INDEX_LAYOUT}+tantivy-{importlib.metadata.version('tantivy')}"


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str


def fingerprint(path: Path, layout: str | None = None) -> str:
    """sha256 of the corpus file's bytes and the index layout (``index_layout()`` unless given; hex,
    64 characters)."""
    digest = hashlib.sha256((layout or index_layout()).encode() + b"\0")
    try:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigError(f"retrieval.corpus: cannot read {path}: {exc}") from exc
    return digest.hexdigest()


def _from_contents(contents: str) -> tuple[str, str]:
    title, _, text = contents.partition("\n")
    title = title.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title, text.strip()


def _utf8(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8: JSON's ``\\ud800`` escapes give lone surrogates, which
    the index refuses."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _fields(row: object, lineno: int, where: str) -> tuple[str, str, str]:
    """A passage's id, title and text from its JSON row."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a passage is a JSON object")
    pid = str(row.get("id", lineno - 1))
    if "contents" in row:
        title, text = _from_contents(str(row["contents"]))
    elif "text" in row:
        title, text = str(row.get("title", "")), str(row["text"])
    else:
        raise ConfigError(f"{where}: a passage needs 'text' (and 'title') or 'contents'")
    return pid, title, text


def read_passages(path: Path) -> Iterator[Passage]:
    """Every passage of the corpus, in file order; ``ConfigError`` naming the line for a bad one
    (not JSON, not UTF-8, a lone surrogate, nested past the parser's depth, a missing field, an id
    seen before). Lines end at ``\\n`` (JSON Lines)."""
    seen: set[str] = set()
    try:
        f = path.open("rb")  # bytes: an undecodable line is named by its number, not met mid-buffer
    except OSError as exc:
        raise ConfigError(f"retrieval.corpus: cannot read {path}: {exc}") from exc
    with f:
        for lineno, raw in enumerate(f, start=1):
            where = f"retrieval.corpus: {path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"{where}: not UTF-8: {exc}") from None
            if not line.strip():
                continue
            try:
                pid, title, text = _fields(json.loads(line), lineno, where)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON: {exc}") from exc
            except RecursionError:  # json.loads (or str of what it read) past Python's depth
                raise ConfigError(f"{where}: nested too deeply to read") from None
            # Only a \u escape makes a lone surrogate (decoded UTF-8 never holds one): check then.
            if "\\u" in line and not all(_utf8(v) for v in (pid, title, text)):
                raise ConfigError(f"{where}: holds a lone surrogate (a \\ud800-\\udfff escape), not text")
            if pid in seen:
                raise ConfigError(f"{where}: passage id {pid!r} appears twice")
            seen.add(pid)
            yield Passage(pid, title, text)
