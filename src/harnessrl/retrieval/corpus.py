"""A retrieval corpus on disk: one passage a JSON line, read once and fingerprinted by its bytes.

Two layouts are read: ``{"id", "title", "text"}`` (harnessrl's, what ``tasks.search`` writes) and
Search-R1's / FlashRAG's ``{"id", "contents"}`` where ``contents`` is ``"Title"\\ntext`` (the wiki-18
dump the Search-R1 paper retrieves from). The fingerprint names the index built from the corpus, so
an index is rebuilt exactly when the corpus's content, the index layout or the tantivy release changes.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from harnessrl.errors import ConfigError
from harnessrl.input_files import open_regular

#: The longest corpus line read. Lines were read whole: a corpus given as one JSON document (a
#: 14 GB wiki dump as an array) was read into memory at once, and parsed, before any error.
MAX_LINE_BYTES = 16 << 20

#: Bumped when the index layout or its analyzers change, so old cached indexes are not reused.
INDEX_LAYOUT = "tantivy-v2-en_stem"  # v2: a null title is no title (v1 indexed the word "None")


def index_layout() -> str:
    """``INDEX_LAYOUT`` and the installed tantivy release: another release may tokenize or store an
    index differently, so an upgrade builds a new index instead of searching one it did not write."""
    return f"{INDEX_LAYOUT}+tantivy-{importlib.metadata.version('tantivy')}"


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str


def _new_digest(layout: str | None = None) -> hashlib._Hash:
    return hashlib.sha256((layout or index_layout()).encode() + b"\0")


def open_corpus(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file (a link to one is followed);
    ``ConfigError`` otherwise. Opened without blocking first: a FIFO given as the corpus held the
    start forever waiting for a writer, and a device (``/dev/zero``) was read without end."""
    try:
        return open_regular(path)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ConfigError(f"retrieval.corpus: {path} is not a regular file") from None
        raise ConfigError(f"retrieval.corpus: cannot read {path}: {exc}") from exc


def fingerprint(path: Path, layout: str | None = None) -> str:
    """sha256 of the corpus file's bytes and the index layout (``index_layout()`` unless given; hex,
    64 characters)."""
    digest = _new_digest(layout)
    try:
        with open_corpus(path) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigError(f"retrieval.corpus: cannot read {path}: {exc}") from exc
    return digest.hexdigest()


def passages_digest() -> hashlib._Hash:
    """A digest for ``read_passages(path, digest)``: its ``hexdigest()`` is then ``fingerprint``'s."""
    return _new_digest()


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


def _scalar(row: dict, key: str, where: str, *, null: str | None = None) -> str:
    """``row[key]`` as text: a string as is, a number as its text; ``null`` (when given) for a JSON
    null. Anything else (null otherwise, true/false, a list, an object) is the line's error: ``str()``
    indexed and returned them as the words "None", "True" or a Python repr."""
    value = row[key]
    if value is None and null is not None:
        return null
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where}: {key!r} must be a string, got {json.dumps(value)[:40]}")


def _fields(row: object, lineno: int, where: str) -> tuple[str, str, str]:
    """A passage's id, title and text from its JSON row."""
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: a passage is a JSON object")
    pid = _scalar(row, "id", where) if "id" in row else str(lineno - 1)
    if "contents" in row:
        title, text = _from_contents(_scalar(row, "contents", where))
    elif "text" in row:
        title = _scalar(row, "title", where, null="") if "title" in row else ""
        text = _scalar(row, "text", where)
    else:
        raise ConfigError(f"{where}: a passage needs 'text' (and 'title') or 'contents'")
    return pid, title, text


class SeenIds:
    """The passage ids read so far, to refuse one seen before. A canonical decimal id (``"0"``,
    ``"21015323"``: the wiki-18 dump's) is a bit in a bitmap, 1 bit an id, while such ids stay
    about as dense as the lines read; any other id is kept as a string. Kept as strings, the
    21 million ids of wiki-18 took about 1.9 GB while its index was built."""

    #: How far past the lines read a numeric id may point and still be a bit (beyond: a string).
    SLACK = 1 << 20

    def __init__(self) -> None:
        self._bits = bytearray()
        self._others: set[str] = set()

    def add(self, pid: str, lineno: int) -> bool:
        """Record ``pid`` (read on line ``lineno``); False if it was recorded before. Where an id was
        recorded (a bit or a string) depends on the line it came on, so both are looked at."""
        canonical = len(pid) <= 18 and pid.isascii() and pid.isdigit() and (pid == "0" or pid[0] != "0")
        number = int(pid) if canonical else -1
        if number >= 0 and self._has_bit(number) or pid in self._others:
            return False
        if 0 <= number < lineno + self.SLACK:
            byte = number >> 3
            if byte >= len(self._bits):  # grown by doubling: amortized linear
                self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
            self._bits[byte] |= 1 << (number & 7)
        else:
            self._others.add(pid)
        return True

    def _has_bit(self, number: int) -> bool:
        byte = number >> 3
        return byte < len(self._bits) and bool(self._bits[byte] >> (number & 7) & 1)


def read_passages(path: Path, digest: hashlib._Hash | None = None) -> Iterator[Passage]:
    """Every passage of the corpus, in file order; ``ConfigError`` naming the line for a bad one
    (not JSON, not UTF-8, a lone surrogate, nested past the parser's depth, an integer of over 4,300
    digits, a missing field, an id seen before). Lines end at ``\\n`` (JSON Lines). ``digest``
    (``passages_digest()``) is fed every byte read, so once the passages are all read it is the
    ``fingerprint`` of exactly what they came from, even if the file was replaced after another look
    at it."""
    seen = SeenIds()
    # Bytes: an undecodable line is named by its number, not met mid-buffer.
    with open_corpus(path) as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if digest is not None:
                digest.update(raw)
            where = f"retrieval.corpus: {path}:{lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise ConfigError(
                    f"{where}: longer than {MAX_LINE_BYTES >> 20} MiB; a corpus is JSON Lines, one "
                    "passage a line (a JSON array or one big document is not)"
                )
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
            except ValueError as exc:  # JSON Python's parser refuses: an integer of over 4,300 digits
                raise ConfigError(f"{where}: cannot be read: {exc}") from None
            except RecursionError:  # json.loads (or str of what it read) past Python's depth
                raise ConfigError(f"{where}: nested too deeply to read") from None
            # Only a \u escape makes a lone surrogate (decoded UTF-8 never holds one): check then.
            if "\\u" in line and not all(_utf8(v) for v in (pid, title, text)):
                raise ConfigError(f"{where}: holds a lone surrogate (a \\ud800-\\udfff escape), not text")
            if not seen.add(pid, lineno):
                raise ConfigError(f"{where}: passage id {pid!r} appears twice")
            yield Passage(pid, title, text)
