"""The index: built once per corpus content (and rebuilt when the content changes), both corpus
layouts read, and a query is only ever words: no query syntax reaches tantivy."""

from __future__ import annotations

import importlib.metadata
import json
import unicodedata
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.retrieval.corpus import INDEX_LAYOUT, fingerprint, read_passages
from harnessrl.retrieval.index import RetrievalIndex, query_words

from .conftest import PASSAGES, write_corpus


def test_an_index_is_built_once_per_corpus_content_and_again_when_it_changes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = RetrievalIndex.for_corpus(write_corpus(tmp_path / "a.jsonl", PASSAGES), cache)
    built = {p.name: p.stat().st_mtime_ns for p in first.folder.iterdir()}
    # The same bytes under another name: the same index, opened, not rebuilt.
    again = RetrievalIndex.for_corpus(write_corpus(tmp_path / "b.jsonl", PASSAGES), cache)
    assert again.folder == first.folder
    assert {p.name: p.stat().st_mtime_ns for p in again.folder.iterdir()} == built
    # Control: one changed passage is another corpus, so another index, which finds the new text.
    changed = [*PASSAGES[:2], {**PASSAGES[2], "text": "Tarsk lies on the river Ombre."}]
    other = RetrievalIndex.for_corpus(write_corpus(tmp_path / "a.jsonl", changed), cache)
    assert other.folder != first.folder
    assert [h.id for h in other.search("Ombre", 3)] == ["tarsk"]
    assert first.search("Ombre", 3) == []
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.folder.name, other.folder.name])


def test_both_corpus_layouts_are_read(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"id": "1", "contents": '"Arlen Voss"\nArlen Voss was born in Tarsk.'})
        + "\n"
        + json.dumps({"id": "2", "title": "Tarsk", "text": "A city."})
        + "\n"
    )
    assert [(p.id, p.title, p.text) for p in read_passages(corpus)] == [
        ("1", "Arlen Voss", "Arlen Voss was born in Tarsk."),
        ("2", "Tarsk", "A city."),
    ]
    hit = RetrievalIndex.for_corpus(corpus, tmp_path / "cache").search("where was Arlen Voss born", 1)[0]
    assert (hit.id, hit.title) == ("1", "Arlen Voss")


@pytest.mark.parametrize(
    "line", ['{"id": "1"}', "not json", '["a list"]', '{"id": "1", "text": "a"}\n{"id": "1", "text": "b"}']
)
def test_a_bad_corpus_is_a_config_error_naming_the_line(tmp_path: Path, line: str) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(line + "\n")
    with pytest.raises(ConfigError, match=r"retrieval\.corpus: .*bad\.jsonl:\d"):
        RetrievalIndex.for_corpus(corpus, tmp_path / "cache")


@pytest.mark.parametrize(
    "query",
    [
        "title:Velmora AND text:*",  # fields, operators, wildcards
        'Velmora" OR "',  # unbalanced quotes
        "Velm~2 Vel* /Vel.*/ [a TO z] ^2 +Velmora -Tarsk (((",  # fuzzy, regex, range, boost, groups
        "../../../etc/passwd Velmora",  # a path is words like any other
        "Velmora " * 5000,  # many terms: only max_terms are searched
    ],
)
def test_query_syntax_never_reaches_the_engine(tmp_path: Path, query: str) -> None:
    index = RetrievalIndex.for_corpus(write_corpus(tmp_path / "c.jsonl", PASSAGES), tmp_path / "cache")
    hits = index.search(query, 3, max_terms=32)
    assert hits and hits[0].id == "velmora"  # searched as plain words, no error, no field magic
    assert len(query_words(query, 32)) <= 32


# Words whose letters carry combining marks (category M*), and Greek capitals whose lower case ends in
# a final sigma: cut at their marks, or lower-cased by Python where tantivy lower-cases otherwise, none
# was found. "Ελλάδα" (precomposed letters only) was found before too: a non-Latin control.
WORLD_WORDS = ["हिन्दी", "กรุงเทพ", "தமிழ்", "İstanbul", "ΟΔΟΣ", "Ελλάδα"]


@pytest.mark.parametrize("word", WORLD_WORDS)
def test_a_passage_is_found_by_its_title_in_any_script(tmp_path: Path, word: str) -> None:
    passages = [
        *PASSAGES,
        {"id": "world", "title": word, "text": f"{word} is named in this passage and in no other."},
        {"id": "latin", "title": "Latin", "text": "A passage in Latin letters only."},
    ]
    index = RetrievalIndex.for_corpus(write_corpus(tmp_path / "c.jsonl", passages), tmp_path / "cache")
    assert [h.id for h in index.search(word, 3)] == ["world"]
    assert query_words(word, 32) == [word]  # one word, left as it is for tantivy to analyze
    assert [h.id for h in index.search(f"where is {word}?", 1)] == ["world"]
    # The same word decomposed (NFD: "I" + a combining dot, base letters + their marks) is found too.
    assert [h.id for h in index.search(unicodedata.normalize("NFD", word), 3)] == ["world"]
    # Control: a Latin word is found as before, and the other word's passage is not returned for it.
    assert [h.id for h in index.search("VELMORA", 3)] == ["velmora"]


def test_a_query_without_words_finds_nothing(tmp_path: Path) -> None:
    index = RetrievalIndex.for_corpus(write_corpus(tmp_path / "c.jsonl", PASSAGES), tmp_path / "cache")
    assert index.search("*** ::: ///", 3) == []
    assert index.search("\u0301 \u093f", 3) == []  # combining marks with no letter: no error
    assert [h.id for h in index.search("Tarsk", 1)] == ["tarsk"]  # control


@pytest.mark.parametrize(
    "line",
    [
        b'{"id": "1", "text": "a lone surrogate \\ud800 here"}',
        b'{"id": "1", "title": "\\udfff", "text": "a"}',
        b'{"id": "\\ud800", "text": "a"}',
        b'{"id": "1", "contents": "\\"T\\ud800\\"\\ntext"}',
        b'{"id": "1", "text": "not UTF-8 \xff\xfe"}',
        b'{"id": "1", "text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # Python's JSON reader refuses an integer of over 4,300 digits with a bare ValueError
        # (not a JSONDecodeError): it was a traceback, and `harnessrl rollout` exited 1.
        b'{"id": "1", "text": "a", "views": ' + b"7" * 5000 + b"}",
    ],
    ids=[
        "surrogate-text",
        "surrogate-title",
        "surrogate-id",
        "surrogate-contents",
        "not-utf8",
        "deep",
        "huge-int",
    ],
)
def test_an_odd_corpus_line_is_a_config_error_naming_the_line_not_a_crash(
    tmp_path: Path, line: bytes
) -> None:
    corpus = tmp_path / "odd.jsonl"
    good = json.dumps(PASSAGES[0]).encode() + b"\n"
    corpus.write_bytes(good + line + b"\n")
    with pytest.raises(ConfigError, match=r"retrieval\.corpus: .*odd\.jsonl:2: "):
        RetrievalIndex.for_corpus(corpus, tmp_path / "cache")
    # Control: the good line alone builds, and an escaped surrogate pair (an emoji) is text.
    emoji = b'{"id": "2", "title": "Keth", "text": "the river Keth \\ud83c\\udf0a"}'
    corpus.write_bytes(good + emoji + b"\n")
    index = RetrievalIndex.for_corpus(corpus, tmp_path / "cache")
    assert [h.text for h in index.search("Keth", 1)] == ["the river Keth \N{WATER WAVE}"]


def test_the_index_cache_is_keyed_by_the_tantivy_release(tmp_path: Path) -> None:
    # Another tantivy release may tokenize or store an index differently: it must not reuse this one.
    corpus = write_corpus(tmp_path / "c.jsonl", PASSAGES)
    installed = importlib.metadata.version("tantivy")
    assert fingerprint(corpus) == fingerprint(corpus, layout=f"{INDEX_LAYOUT}+tantivy-{installed}")
    assert fingerprint(corpus) != fingerprint(corpus, layout=f"{INDEX_LAYOUT}+tantivy-0.0.1")
    index = RetrievalIndex.for_corpus(corpus, tmp_path / "cache")
    assert index.folder.name == fingerprint(corpus)


def test_a_build_a_killed_process_left_is_removed_by_the_next_build(tmp_path: Path) -> None:
    """A build killed outright (SIGKILL, the OOM killer) left its temporary folder in the cache for
    good: gigabytes for a large corpus, one more at every crash. A live build's folder is kept."""
    import os
    import subprocess
    import sys

    from harnessrl.retrieval.index import BUILDING_PREFIX
    from harnessrl.sandbox.host import make_owned_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.run(  # a builder that dies without removing its folder (os._exit: no cleanup)
        [
            sys.executable,
            "-c",
            "import os, sys; from pathlib import Path; from harnessrl.sandbox.host import make_owned_dir\n"
            f"folder, _ = make_owned_dir(Path({str(cache)!r}), {BUILDING_PREFIX!r})\n"
            "(folder / 'index').mkdir(); (folder / 'index' / 'segment').write_bytes(b'x' * 4096)\n"
            "print(folder, flush=True); os._exit(0)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    left = Path(dead.stdout.strip())
    live, owner = make_owned_dir(cache, BUILDING_PREFIX)  # the control: a build still running
    try:
        RetrievalIndex.for_corpus(write_corpus(tmp_path / "corpus.jsonl", PASSAGES), cache)
        assert not left.exists()
        assert live.is_dir()
    finally:
        os.close(owner)


def test_a_home_relative_corpus_and_cache_dir_are_the_homes(tmp_path: Path, monkeypatch) -> None:
    """``cache_dir = "~/..."`` built the index into a folder literally named ``~`` under the working
    directory, and ``corpus = "~/..."`` was read beside the config file (``<config dir>/~/...``)."""
    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.controller.stack import retrieval_routes
    from harnessrl.retrieval.config import RetrievalConfig

    home, work, configs = tmp_path / "home", tmp_path / "work", tmp_path / "configs"
    for folder in (home, work, configs):
        folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    write_corpus(home / "corpus.jsonl", PASSAGES)
    config = configs / "rollout.toml"
    config.write_text(
        '[harness]\ncommand = ["/bin/true"]\n[retrieval]\ncorpus = "~/corpus.jsonl"\ncache_dir = "~/indexes"\n'
    )
    retrieval = load_rollout_config(str(config), []).retrieval
    assert retrieval is not None
    assert (retrieval.corpus, retrieval.cache_dir) == (str(home / "corpus.jsonl"), str(home / "indexes"))
    assert retrieval_routes(retrieval)  # the index is built
    assert len(list((home / "indexes").iterdir())) == 1
    # Built in Python (no config file to load): the same.
    direct = RetrievalConfig(corpus="~/corpus.jsonl", cache_dir="~/direct")
    assert (direct.corpus, direct.cache_dir) == (str(home / "corpus.jsonl"), str(home / "direct"))
    assert retrieval_routes(direct)
    assert len(list((home / "direct").iterdir())) == 1
    assert list(work.iterdir()) == [] and list(configs.iterdir()) == [config]


@pytest.mark.timeout(60)  # the bug this guards against was a hang: fail, do not wait 10 minutes
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_corpus_that_is_not_a_regular_file_is_refused_at_the_start(tmp_path: Path, kind: str) -> None:
    """A FIFO as the corpus held the start forever (opened, waiting for a writer that never comes);
    ``/dev/zero`` was read without end. Each is the setting's error, naming it."""
    import os

    from harnessrl.controller.stack import retrieval_routes
    from harnessrl.retrieval.config import RetrievalConfig

    corpus = tmp_path / "corpus.jsonl"
    if kind == "fifo":
        os.mkfifo(corpus)
    elif kind == "folder":
        corpus.mkdir()
    else:
        corpus = Path("/dev/zero")
    config = RetrievalConfig(corpus=str(corpus), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"retrieval\.corpus: .*(not a regular file|Is a directory)"):
        retrieval_routes(config)
    regular = write_corpus(tmp_path / "regular.jsonl", PASSAGES)  # control
    assert retrieval_routes(RetrievalConfig(corpus=str(regular), cache_dir=str(tmp_path / "cache")))


def test_a_corpus_written_as_one_json_document_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """A corpus given as a JSON array (one line) was read into memory whole, then parsed, before its
    error: a 14 GB dump exhausted the machine. Lines are read up to ``MAX_LINE_BYTES``."""
    import tracemalloc

    from harnessrl.retrieval.corpus import MAX_LINE_BYTES

    passages = [{"id": str(i), "title": f"T{i}", "text": "word " * 200} for i in range(40_000)]
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps(passages))
    assert corpus.stat().st_size > 2 * MAX_LINE_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"corpus\.json:1: longer than 16 MiB; a corpus is JSON Lines"):
            list(read_passages(corpus))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # What reading one capped line takes (its bytes, copied once), not the document and its objects.
    assert peak < 3 * MAX_LINE_BYTES
    write_corpus(corpus, passages[:3])  # control: the same passages, one a line
    assert [p.id for p in read_passages(corpus)] == ["0", "1", "2"]


def test_numeric_ids_are_checked_for_repeats_in_a_bitmap_not_kept_as_strings(tmp_path: Path) -> None:
    """wiki-18's 21 million ids ("0" to "21015323") were kept as strings to refuse a repeat: about
    1.9 GB while the index was built. A dense numeric id is now a bit; every repeat is still found,
    however the two ids were kept."""
    import tracemalloc

    from harnessrl.retrieval.corpus import SeenIds

    corpus = tmp_path / "wiki.jsonl"
    with corpus.open("w") as f:
        for i in range(100_000):
            f.write(json.dumps({"id": str(i), "contents": f'"T"\\nw{i}'}) + "\n")
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_passages(corpus))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 100_000
    assert peak < 3 << 20, peak  # as strings, these ids alone took about 9 MB

    far = str(SeenIds.SLACK + 10)  # first met as a string (far past the lines read), later as a bit
    seen = SeenIds()
    assert seen.add(far, 1) and not seen.add(far, SeenIds.SLACK)
    assert seen.add("7", 1) and not seen.add("7", 5) and seen.add("07", 6) and not seen.add("07", 7)
    assert seen.add("9" * 5000, 8) and not seen.add("9" * 5000, 9)  # past int()'s digit limit: a string
    with pytest.raises(ConfigError, match=r"wiki\.jsonl:3: passage id '1' appears twice"):
        write_corpus(corpus, [{"id": "0", "text": "a"}, {"id": "1", "text": "b"}, {"id": "1", "text": "c"}])
        list(read_passages(corpus))
