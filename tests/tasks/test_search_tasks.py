"""The search tasks: a deterministic world, held-out chains disjoint from training, every hop
answerable from the corpus, Search-R1's scoring, and the question-answering JSONL layouts."""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from harnessrl.errors import ConfigError
from harnessrl.tasks.search import (
    corpus_passages,
    exact_match,
    f1,
    load_searchqa,
    make_questions,
    make_world,
    score_search,
    write_dataset,
)
from harnessrl.trainer.task_sources import parse_task_source

WORLD = make_world(0, countries=10, cities=60, people=120, orgs=40)


def test_the_dataset_is_the_same_bytes_for_the_same_seed(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", seed=3, train=50, heldout=10)
    write_dataset(tmp_path / "b", seed=3, train=50, heldout=10)
    write_dataset(tmp_path / "c", seed=4, train=50, heldout=10)
    for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()  # control


def test_held_out_chains_touch_no_entity_of_any_training_question() -> None:
    train = make_questions(WORLD, "train", 300)
    heldout = make_questions(WORLD, "heldout", 60)
    names = lambda tasks: {n for t in tasks for n in t["hidden"]["path"][:-1]}  # noqa: E731
    assert names(train) and names(heldout)
    assert names(train) & names(heldout) == set()
    assert {t["prompt"] for t in train} & {t["prompt"] for t in heldout} == set()


def test_every_hop_is_stated_in_a_passage_about_the_entity_before_it() -> None:
    passages = corpus_passages(WORLD)
    by_title: dict[str, str] = {}
    for p in passages:
        by_title[p["title"]] = by_title.get(p["title"], "") + " " + p["text"]
    for task in make_questions(WORLD, "train", 200):
        path = task["hidden"]["path"]
        assert len(path) == task["hops"] + 1
        for here, there in pairwise(path):
            assert there.removeprefix("the ") in by_title[here], (task["prompt"], here, there)


def test_scoring_is_search_r1s_exact_match_and_f1() -> None:
    assert exact_match("The  Arlen Voss.", ["arlen voss"]) == 1.0
    assert exact_match("Arlen", ["Arlen Voss"]) == 0.0
    assert f1("Arlen", ["Arlen Voss"]) == pytest.approx(2 / 3)
    assert f1("nothing", ["Arlen Voss"]) == 0.0


def test_the_answer_file_is_read_without_following_a_link(tmp_path: Path) -> None:
    task = {"prompt": "q", "hidden": {"answers": ["Arlen Voss"]}}
    gold = tmp_path / "gold.txt"
    gold.write_text("Arlen Voss\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.symlink(gold, workspace / "answer.txt")
    inp = SimpleNamespace(task=task, workspace=workspace, calls=())
    assert score_search(inp)["reward"] == 0.0  # a link to the answer is no answer
    (workspace / "answer.txt").unlink()
    (workspace / "answer.txt").write_text('"Arlen Voss"\nmore\n')
    assert score_search(inp) == {"reward": 1.0, "em": 1.0, "f1": 1.0, "answer": "Arlen Voss"}  # control


def test_searchqa_reads_the_search_r1_nq_and_hotpotqa_layouts(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": "nq-1", "question": "who wrote x?", "golden_answers": ["A", "B"]},
        {"question": "where is y?", "answer": ["C"]},
        {"_id": "hp-1", "question": "which z?", "answer": "D", "type": "bridge"},
        {"id": "sr-1", "question": "when w?", "reward_model": {"ground_truth": {"target": ["E"]}}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_searchqa(path, split="train")
    assert [t.task_id for t in tasks] == ["nq-1", "qa-2", "hp-1", "sr-1"]
    assert [t.data["hidden"]["answers"] for t in tasks] == [["A", "B"], ["C"], ["D"], ["E"]]
    assert tasks[0].data["prompt"] == "who wrote x?" and "answer" not in tasks[0].data
    source = parse_task_source({"type": "searchqa", "path": str(path), "prompt_template": "Q: {question}"})
    assert source.load(split="train")[2].data["prompt"] == "Q: which z?"


@pytest.mark.parametrize("row", [{"question": "q"}, {"answer": "a"}, {"question": "", "answer": "a"}])
def test_searchqa_refuses_a_row_without_question_or_answers(tmp_path: Path, row: dict) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1"):
        load_searchqa(path, split="train")
