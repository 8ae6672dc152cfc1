"""What the retriever does with what it was not built for: a passage's title of any length (cut like
its text), a cache folder it cannot use (the setting's error, exit 2 from the CLI, not a traceback),
a corpus replaced while its index is built (the index is named by the bytes it holds), passage
fields that are no text, and a shared temp folder where another user could plant the ``search``
command (the fallback folder is this user's own, or refused)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from harnessrl.errors import ConfigError
from harnessrl.retrieval import harness_tools
from harnessrl.retrieval import index as index_module
from harnessrl.retrieval.corpus import fingerprint
from harnessrl.retrieval.index import RetrievalIndex

from .conftest import PASSAGES, write_corpus
from .rollout_configs import scripted_rollout_config


def test_a_long_title_is_cut_like_the_text(make_search_gateway) -> None:
    # A FlashRAG row whose contents has no newline is all title: it came back whole (40,000 characters).
    long = {"id": "long", "title": "Zorblat " * 5000, "text": "Zorblat " * 5000}
    gw = make_search_gateway(passages=[*PASSAGES, long], max_passage_chars=100)
    rollout = gw.rollout()
    headers = {"authorization": f"Bearer {rollout['api_key']}"}
    answer = httpx.post(gw.search_url(rollout), json={"query": "Zorblat"}, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    [hit] = answer.json()["passages"]
    assert (hit["id"], hit["title"], hit["text"]) == ("long", long["title"][:100], long["text"][:100])
    [logged] = gw.store.list_tool_requests(rollout["rollout_id"])
    assert logged.response["passages"][0]["title"] == long["title"][:100]
    # Control: a title within the limit comes back as written.
    short = httpx.post(gw.search_url(rollout), json={"query": "Velmora"}, headers=headers, timeout=30)
    assert short.json()["passages"][0]["title"] == "Velmora"


def test_a_cache_dir_that_cannot_hold_an_index_is_a_config_error_naming_it(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", PASSAGES)
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    for cache in (a_file, a_file / "below"):  # FileExistsError, NotADirectoryError
        with pytest.raises(ConfigError, match=r"^retrieval\.cache_dir: .*not-a-folder"):
            RetrievalIndex.for_corpus(corpus, cache)
    # Control: a folder works.
    assert [h.id for h in RetrievalIndex.for_corpus(corpus, tmp_path / "cache").search("Tarsk", 1)] == [
        "tarsk"
    ]


#: A child that builds ``argv[1]``'s index into the cache ``argv[2]`` with writes past ``argv[3]``
#: bytes a file refused (EFBIG: what a full disk does to tantivy's writer, without filling one), and
#: prints what ``for_corpus`` raised (or the passages it found).
_BUILD_WITH_FILE_LIMIT = """
import resource, signal, sys
from pathlib import Path
from harnessrl.retrieval.index import RetrievalIndex
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    index = RetrievalIndex.for_corpus(Path(sys.argv[1]), Path(sys.argv[2]))
except Exception as exc:
    print("RAISED", type(exc).__name__, exc)
else:
    print("BUILT", index.passages)
"""


@pytest.mark.parametrize("limit", [32 * 1024, 1 << 40], ids=["disk-full", "control"])
def test_a_cache_that_runs_out_of_space_is_a_config_error_naming_it(tmp_path: Path, limit: int) -> None:
    # tantivy reports a write that fails (no space left) as a ValueError: it was a traceback, not the
    # cache_dir's config error that docs/retrieval.md promises for "no space".
    words = [f"w{i:04d}x" for i in range(4000)]
    passages = [
        {"id": str(i), "title": f"T{i}", "text": " ".join(words[(i * 7 + j) % 4000] for j in range(60))}
        for i in range(1500)
    ]
    corpus = write_corpus(tmp_path / "corpus.jsonl", passages)
    cache = tmp_path / "cache"
    proc = subprocess.run(
        [sys.executable, "-B", "-c", _BUILD_WITH_FILE_LIMIT, str(corpus), str(cache), str(limit)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    if limit == 1 << 40:  # the control: the same child, room enough, builds it
        assert proc.stdout.strip() == "BUILT 1500", proc.stdout
        return
    assert proc.stdout.startswith("RAISED ConfigError retrieval.cache_dir: "), (
        proc.stdout + proc.stderr[-2000:]
    )
    assert str(cache) in proc.stdout
    assert list(cache.iterdir()) == []  # the failed build left nothing behind


def test_a_damaged_cached_index_is_a_config_error_naming_its_folder(tmp_path: Path) -> None:
    # A cached index whose files went missing (a cleanup, a disk error) raised tantivy's ValueError.
    corpus = write_corpus(tmp_path / "corpus.jsonl", PASSAGES)
    cache = tmp_path / "cache"
    folder = RetrievalIndex.for_corpus(corpus, cache).folder
    for segment_file in folder.glob("*.store"):
        segment_file.unlink()
    with pytest.raises(ConfigError, match=rf"^retrieval\.cache_dir: the index in {folder} cannot be read"):
        RetrievalIndex.for_corpus(corpus, cache)
    # What the message says to do works: without the folder it is built again.
    shutil.rmtree(folder)
    assert [h.id for h in RetrievalIndex.for_corpus(corpus, cache).search("Tarsk", 1)] == ["tarsk"]


def test_the_rollout_command_names_an_unusable_cache_dir_and_exits_2(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", PASSAGES)
    (tmp_path / "not-a-folder").write_text("")
    config = scripted_rollout_config(
        tmp_path,
        "rollout.toml",
        f"""
[retrieval]
corpus = "{corpus}"
cache_dir = "{tmp_path / "not-a-folder"}"

[harness]
preset = "python"
command = ["{sys.executable}", "-c", "pass"]
tools = ["search"]
sandbox = "none"

[evaluator]
type = "exact_match"
""",
    )
    run_dir = tmp_path / "run"
    task = json.dumps({"prompt": "p", "hidden": {"answer": "x"}})
    proc = subprocess.run(
        [sys.executable, "-m", "harnessrl", "rollout", "--config", str(config), "--task", task]
        + ["--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "retrieval.cache_dir" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not run_dir.exists()  # nothing half-created


def test_a_corpus_replaced_while_indexed_is_cached_under_the_bytes_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The corpus is read twice, hashed then indexed; here it is replaced between the two reads, as
    # `python -m harnessrl.tasks.search --out` rewrites its files (data regenerated as a run starts).
    # The new content was cached under the old content's name: the old corpus then got its passages.
    cache = tmp_path / "cache"
    corpus = write_corpus(tmp_path / "corpus.jsonl", PASSAGES)
    old_digest = fingerprint(corpus)
    replacement = write_corpus(
        tmp_path / "next.jsonl", [{"id": "ombre", "title": "Ombre", "text": "A river."}]
    )

    def fingerprint_then_replaced(path: Path) -> str:
        digest = fingerprint(path)
        replacement.replace(path)
        return digest

    monkeypatch.setattr(index_module, "fingerprint", fingerprint_then_replaced)
    built = RetrievalIndex.for_corpus(corpus, cache)
    monkeypatch.undo()
    assert [h.id for h in built.search("Ombre", 3)] == ["ombre"]  # what the build read
    assert built.folder.name == fingerprint(corpus) != old_digest
    # The old content again: its own index, not the new passages under its name.
    write_corpus(corpus, PASSAGES)
    again = RetrievalIndex.for_corpus(corpus, cache)
    assert again.folder.name == old_digest
    assert [h.id for h in again.search("Tarsk", 1)] == ["tarsk"]
    assert again.search("Ombre", 3) == []


@pytest.mark.parametrize(
    "row",
    [
        {"id": "n", "title": "Null", "text": None},
        {"id": None, "title": "Null", "text": "a text"},
        {"id": "n", "title": ["a", "list"], "text": "a text"},
        {"id": "n", "title": "Null", "text": True},
        {"id": "n", "contents": None},
        {"id": "n", "contents": {"title": "an object"}},
    ],
)
def test_a_passage_field_that_is_no_text_is_a_config_error_naming_the_line(tmp_path: Path, row: dict) -> None:
    # null, true and lists were indexed as str() of them: a search for "None" found the passage.
    corpus = write_corpus(tmp_path / "bad.jsonl", [*PASSAGES, row])
    with pytest.raises(
        ConfigError, match=r"retrieval\.corpus: .*bad\.jsonl:4: '(id|title|text|contents)' must"
    ):
        RetrievalIndex.for_corpus(corpus, tmp_path / "cache")


def test_a_null_title_is_no_title_and_numbers_are_read_as_written(tmp_path: Path) -> None:
    rows = [{"id": 7, "title": None, "text": "Velmora lies north."}, {"id": "y", "title": 1432, "text": 1.5}]
    index = RetrievalIndex.for_corpus(write_corpus(tmp_path / "c.jsonl", rows), tmp_path / "cache")
    [hit] = index.search("Velmora", 3)
    assert (hit.id, hit.title, hit.text) == ("7", "", "Velmora lies north.")
    assert index.search("None", 3) == []
    assert [(h.id, h.title, h.text) for h in index.search("1432", 3)] == [("y", "1432", "1.5")]  # control


def test_without_a_project_the_search_command_lives_in_a_private_folder_of_this_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the temp folder every user shares
    # Another user got there first: the fixed folder, world-writable, with a script of theirs.
    planted = tmp_path / "harnessrl-tools" / "bin"
    planted.mkdir(parents=True)
    (planted / "search").write_text("#!/bin/sh\necho planted\n")
    for folder in (planted, planted.parent):
        folder.chmod(0o777)
    folder = harness_tools.search_bin_dir()
    assert planted not in (folder, *folder.parents)  # was used as is (and rewritten, still theirs)
    private = tmp_path / f"harnessrl-tools-{os.geteuid()}"
    assert private in folder.parents
    info = private.stat()
    assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert (
        folder / "search"
    ).read_text() == f'#!/bin/sh\nexec "{sys.executable}" -I "{harness_tools.CLIENT}" "$@"\n'
    assert harness_tools.search_bin_dir() == folder  # control: found again, not made anew
    # Another install of harnessrl (another interpreter): a folder of its own, the first one untouched.
    monkeypatch.setattr(sys, "executable", "/opt/other-venv/bin/python")
    other = harness_tools.search_bin_dir()
    assert other != folder and "/opt/other-venv/bin/python" in (other / "search").read_text()
    assert "/opt/other-venv" not in (folder / "search").read_text()


@pytest.mark.parametrize("how", ["writable by others", "a link", "another user's"])
def test_a_temp_tool_folder_that_is_not_this_users_own_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    private = tmp_path / f"harnessrl-tools-{os.geteuid()}"
    if how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        private.symlink_to(tmp_path / "elsewhere")
    else:
        private.mkdir()
        private.chmod(0o777 if how == "writable by others" else 0o700)
        if how == "another user's":
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(private, 12345, 12345)
    with pytest.raises(ConfigError, match=r"harness\.tools: .*harnessrl-tools-\d+ is not a private folder"):
        harness_tools.search_bin_dir()
    assert not list(tmp_path.rglob("search"))  # nothing written there
