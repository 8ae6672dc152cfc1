"""A BM25 index over a corpus (tantivy), built once per corpus content and searched read-only.

Why tantivy and not bm25s: measured side by side on this machine's 2 shared cores with 100k
passages, one query at a time as a rollout's tool asks (benchmarks/retrieval_speed.py): on the
encyclopedia's questions tantivy answered 55 queries/s (p99 72 ms) against bm25s's 27 (p99 116 ms),
on random-word queries 3,650 against 24, because bm25s scores every document of the corpus in numpy
for each query (its speed is in batches, which a tool call never is); tantivy also keeps its index on
disk (memory-mapped: the gateway's memory does not grow with the corpus) and built 100k passages in
6.5 s against bm25s's 12.9 s.

A query is never parsed as tantivy's query language: it is cut to its words (letters, digits and the
combining marks inside them; ASCII lower-cased) and those are searched as a disjunction over title and
text, so no field name, range, regex, phrase or wildcard in a query reaches the engine, and nothing in a
query names a file. Everything else about a word (its case, how it splits into tokens, stemming) is
left to tantivy's analyzer, the one that indexed the corpus, so a word matches exactly what tantivy's
own parser would match it to.
"""

from __future__ import annotations

import itertools
import os
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import ConfigError
from harnessrl.retrieval.corpus import fingerprint, index_layout, passages_digest, read_passages
from harnessrl.sandbox.host import make_owned_dir, sweep_abandoned

#: Only ASCII is lower-cased here, which is all the query language's operators (AND, OR, NOT, IN, TO)
#: need to lose their meaning. The rest is tantivy's: Python's ``str.lower`` disagrees with it
#: ("ΟΔΟΣ" ends in "ς" in Python, "σ" in tantivy's index), so a word lower-cased here could never match.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_READY = "harnessrl-index-ready"  # written last: a folder without it is a build that died
#: The folders builds run in, in the cache (each holds its builder's owner lock and ``index/``).
BUILDING_PREFIX = ".building-"


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    title: str
    text: str
    score: float


def _in_word(char: str) -> bool:
    # Combining marks (Unicode category M*) are parts of their word: Devanagari's virama and vowel
    # signs, Thai's and Tamil's vowel marks, the dot of a decomposed "İ". Cutting at them left
    # fragments that no indexed token equals.
    return char.isalnum() or unicodedata.category(char).startswith("M")


def query_words(query: str, max_terms: int) -> list[str]:
    """The words of ``query`` that are searched, at most ``max_terms``: runs of letters, digits and
    combining marks of the NFC form (a decomposed query matches the composed text corpora hold),
    with ASCII letters lower-cased."""
    runs = itertools.groupby(unicodedata.normalize("NFC", query), key=_in_word)
    words = ("".join(chars).translate(_ASCII_LOWER) for in_word, chars in runs if in_word)
    return list(itertools.islice(words, max_terms))


def default_cache_dir() -> Path:
    """``$HARNESSRL_CACHE_DIR/retrieval`` (as the engines' model cache), else ``~/.cache/harnessrl/retrieval``."""
    override = os.environ.get("HARNESSRL_CACHE_DIR")
    return (Path(override) if override else Path.home() / ".cache" / "harnessrl") / "retrieval"


def _schema():  # type: ignore[no-untyped-def]
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name="en_stem")
    builder.add_text_field("text", stored=True, tokenizer_name="en_stem")
    return builder.build()


class IndexWriteError(OSError):
    """tantivy could not write an index into the cache (no space left, a file it could not create):
    tantivy raises these as ``ValueError``; as an ``OSError`` they are the cache folder's error."""


def build_index(corpus: Path, folder: Path) -> tuple[int, str]:
    """Index every passage of ``corpus`` into the empty ``folder``; returns the passage count and the
    ``fingerprint`` of the bytes indexed (read in the same pass as the passages). ``ConfigError`` for
    a bad corpus (``read_passages``), ``IndexWriteError`` when tantivy cannot write the index."""
    import tantivy

    count = 0
    digest = passages_digest()
    try:
        index = tantivy.Index(_schema(), path=str(folder))
        writer = index.writer(heap_size=128_000_000, num_threads=1)
        for passage in read_passages(corpus, digest):  # raises ConfigError only, never ValueError
            writer.add_document(tantivy.Document(id=passage.id, title=passage.title, text=passage.text))
            count += 1
        if count == 0:
            raise ConfigError(f"retrieval.corpus: {corpus} holds no passage")
        writer.commit()
        writer.wait_merging_threads()
    except ValueError as exc:  # tantivy's writer died (disk full: "An index writer was killed")
        raise IndexWriteError(f"tantivy could not write the index: {exc}") from None
    (folder / _READY).write_text(f"{index_layout()}\n{count}\n")
    return count, digest.hexdigest()


class RetrievalIndex:
    """A built index, opened read-only. ``search`` is safe from several threads at once."""

    def __init__(self, folder: Path, *, fingerprint: str = ""):
        import tantivy

        ready = folder / _READY
        if not ready.is_file():
            raise ConfigError(f"retrieval: {folder} is not a finished index")
        self.folder = folder
        self.fingerprint = fingerprint
        try:
            self.passages = int(ready.read_text().split()[1])
            self._index = tantivy.Index.open(str(folder))
            self._searcher = self._index.searcher()
        except (ValueError, IndexError) as exc:  # a cached index damaged since it was built (files gone)
            raise ConfigError(
                f"retrieval.cache_dir: the index in {folder} cannot be read ({exc}); "
                "remove that folder and it is built again"
            ) from None

    @classmethod
    def for_corpus(cls, corpus: Path, cache_dir: Path | None = None) -> RetrievalIndex:
        """The index of ``corpus``'s current content: opened from the cache, or built there first.
        Concurrent builders of one corpus each build in a folder of their own; the first to finish
        names it, the others drop theirs."""
        digest = fingerprint(corpus)
        cache = cache_dir or default_cache_dir()
        folder = cache / digest
        try:
            if not (folder / _READY).is_file():
                cache.mkdir(parents=True, exist_ok=True)
                # Builds a killed process left (SIGKILL, the OOM killer: gigabytes for a large corpus)
                # are removed; a live build holds its folder's lock (``make_owned_dir``).
                sweep_abandoned(cache, BUILDING_PREFIX, unlocked_grace_s=None)
                owned, owner = make_owned_dir(cache, BUILDING_PREFIX)
                building = owned / "index"
                building.mkdir()
                try:
                    _count, digest = build_index(corpus, building)
                    # Named by the bytes it holds: a corpus replaced after ``fingerprint`` read it
                    # (data regenerated as a run starts) left the new content under the old name.
                    folder = cache / digest
                    try:
                        building.rename(folder)
                    except OSError:  # another process named it first (or a dead build left a folder)
                        if not (folder / _READY).is_file():
                            shutil.rmtree(folder, ignore_errors=True)
                            building.rename(folder)
                finally:
                    shutil.rmtree(owned, ignore_errors=True)
                    os.close(owner)
            return cls(folder, fingerprint=digest)
        except OSError as exc:  # not a folder, not writable, disk full: the setting's error, not a traceback
            where = "retrieval.cache_dir" if cache_dir else "retrieval.cache_dir (unset: the default)"
            raise ConfigError(f"{where}: cannot keep the index of {corpus} in {cache}: {exc}") from exc

    def search(self, query: str, k: int, *, max_terms: int = 32) -> list[Hit]:
        """The ``k`` best passages for ``query`` by BM25 over title and text (best first)."""
        words = query_words(query, max_terms)
        if not words or k < 1:
            return []
        parsed, _errors = self._index.parse_query_lenient(" ".join(words), ["title", "text"])
        result = self._searcher.search(parsed, k)
        hits = []
        for score, address in result.hits:
            doc = self._searcher.doc(address)
            hits.append(Hit(doc["id"][0], doc["title"][0], doc["text"][0], float(score)))
        return hits
