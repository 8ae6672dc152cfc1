"""The index: built once per corpus content (and rebuilt when the content changes), both corpus
layouts read, and a query is only ever words: no query syntax reaches tantivy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harnessrl.errors import ConfigError
from harnessrl.retrieval.corpus import read_passages
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


def test_a_query_without_words_finds_nothing(tmp_path: Path) -> None:
    index = RetrievalIndex.for_corpus(write_corpus(tmp_path / "c.jsonl", PASSAGES), tmp_path / "cache")
    assert index.search("*** ::: ///", 3) == []
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
    ],
    ids=["surrogate-text", "surrogate-title", "surrogate-id", "surrogate-contents", "not-utf8", "deep"],
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
