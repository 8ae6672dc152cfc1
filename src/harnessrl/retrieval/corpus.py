"""A retrieval corpus on disk: one passage a JSON line, read once and fingerprinted by its bytes.

Two layouts are read: ``{"id", "title", "text"}`` (harnessrl's, what ``tasks.search`` writes) and
Search-R1's / FlashRAG's ``{"id", "contents"}`` where ``contents`` is ``"Title"\\ntext`` (the wiki-18
dump the Search-R1 paper retrieves from). The fingerprint names the index built from the corpus, so
an index is rebuilt exactly when the corpus's content (or the index layout) changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import ConfigError

#: Bumped when the index layout or its analyzers change, so old cached indexes are not reused.
INDEX_LAYOUT = "tantivy-v1-en_stem"


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str


def fingerprint(path: Path) -> str:
    """sha256 of the corpus file's bytes and the index layout (hex, 64 characters)."""
    digest = hashlib.sha256(INDEX_LAYOUT.encode() + b"\0")
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


def read_passages(path: Path) -> Iterator[Passage]:
    """Every passage of the corpus, in file order; ``ConfigError`` naming the line for a bad one."""
    seen: set[str] = set()
    try:
        f = path.open(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"retrieval.corpus: cannot read {path}: {exc}") from exc
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"retrieval.corpus: {path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: a passage is a JSON object")
            pid = str(row.get("id", lineno - 1))
            if "contents" in row:
                title, text = _from_contents(str(row["contents"]))
            elif "text" in row:
                title, text = str(row.get("title", "")), str(row["text"])
            else:
                raise ConfigError(f"{where}: a passage needs 'text' (and 'title') or 'contents'")
            if pid in seen:
                raise ConfigError(f"{where}: passage id {pid!r} appears twice")
            seen.add(pid)
            yield Passage(pid, title, text)
