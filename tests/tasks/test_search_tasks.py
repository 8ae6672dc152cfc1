"""The search tasks: a deterministic world, held-out chains disjoint from training, every hop
answerable from the corpus, Search-R1's scoring, and the question-answering JSONL layouts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest

from harnessrl.controller.evaluators import build_evaluator
from harnessrl.controller.evaluators.types import EvaluationInput, EvaluatorError
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


def test_searchqa_reads_numeric_golds_as_written(tmp_path: Path) -> None:
    """``1e3`` and ``2.50`` were read as the floats 1000.0 and 2.5: the golds "1000.0" and "2.5", which
    the answers "1000" and "2.50" (the dataset's own) could never match."""
    path = tmp_path / "qa.jsonl"
    path.write_text('{"id": "n-1", "question": "how many?", "answer": [1e3, 2.50, 7]}\n')
    [task] = load_searchqa(path, split="train")
    assert task.data["hidden"]["answers"] == ["1e3", "2.50", "7"]
    assert exact_match("2.50", task.data["hidden"]["answers"]) == 1.0  # was 0: the gold read "2.5"


@pytest.mark.parametrize(
    "row",
    [
        {"question": "q"},
        {"answer": "a"},
        {"question": "", "answer": "a"},
        # ids "None", "" and "['x']" before
        {"id": None, "question": "q", "answer": "a"},
        {"_id": "", "question": "q", "answer": "a"},
        {"id": ["x"], "question": "q", "answer": "a"},
    ],
)
def test_searchqa_refuses_a_row_without_question_or_answers(tmp_path: Path, row: dict) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1"):
        load_searchqa(path, split="train")


def _inp(workspace: Path, answers: object = ("Keth",)) -> SimpleNamespace:
    answers = list(answers) if isinstance(answers, tuple) else answers
    return SimpleNamespace(
        task={"prompt": "q", "hidden": {"answers": answers}}, workspace=workspace, calls=()
    )


@pytest.mark.parametrize("kind", ["directory", "fifo", "socket"])
def test_an_answer_txt_that_is_no_regular_file_is_no_answer_never_an_error(tmp_path: Path, kind: str) -> None:
    # An exception here is the scorer's failure: the controller would retry it and leave the rollout
    # out of the baseline, so the agent's 0 would become "not counted" (a directory did that).
    workspace = tmp_path / "ws"
    workspace.mkdir()
    answer = workspace / "answer.txt"
    if kind == "directory":
        answer.mkdir()
        (answer / "Keth").write_text("Keth\n")
    elif kind == "fifo":
        os.mkfifo(answer)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(answer))
        server.close()
    assert score_search(_inp(workspace)) == {"reward": 0.0, "em": 0.0, "f1": 0.0, "answer": None}
    # Control: the same workspace with a regular answer.txt holding the gold earns 1.
    shutil.rmtree(answer) if answer.is_dir() else answer.unlink()
    answer.write_text("Keth\n")
    assert score_search(_inp(workspace))["reward"] == 1.0


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("the", "The The"), (".", "!"), ("", "A"), ("a", "The"), ("the", "!"), ("", ""), ("an", "  ")],
)
def test_an_empty_ish_answer_never_matches_a_gold_that_normalises_to_nothing(
    prediction: str, gold: str
) -> None:
    assert exact_match(prediction, [gold]) == 0.0
    assert f1(prediction, [gold]) == 0.0


def test_a_gold_that_normalises_to_nothing_is_matched_on_case_and_spaces_only() -> None:
    assert exact_match("the  THE", ["The The"]) == 1.0
    assert exact_match("a", ["A"]) == exact_match("!", ["!"]) == 1.0
    assert f1("The The", ["The The"]) == 1.0
    assert f1("the the band", ["The The"]) == 0.0  # all or nothing: no partial credit for articles
    assert exact_match("The Keth.", ["Keth"]) == 1.0  # control: Search-R1's normalisation otherwise


def test_answers_given_as_one_string_are_one_answer_not_its_characters(tmp_path: Path) -> None:
    (tmp_path / "answer.txt").write_text("p\n")
    assert score_search(_inp(tmp_path, "Paris"))["reward"] == 0.0
    (tmp_path / "answer.txt").write_text("paris\n")
    assert score_search(_inp(tmp_path, "Paris"))["reward"] == 1.0


@pytest.mark.parametrize(
    "answers",
    [7, True, None, [], [""], ["  ", ""], [{"a": 1}], [["Paris"]], [True], {"answers": "x"}],
    ids=repr,
)
def test_hidden_answers_that_are_not_strings_are_the_tasks_error(tmp_path: Path, answers: object) -> None:
    (tmp_path / "answer.txt").write_text("x\n")
    with pytest.raises(ConfigError, match=r"hidden\.answers"):
        score_search(_inp(tmp_path, answers))
    with pytest.raises(ConfigError, match=r"hidden\.answers"):
        score_search(SimpleNamespace(task={"prompt": "q"}, workspace=tmp_path, calls=()))


def test_a_bad_task_is_the_evaluators_failure_through_the_python_evaluator(tmp_path: Path) -> None:
    evaluator = build_evaluator({"type": "python", "function": "harnessrl.tasks.search:score_search"})
    (tmp_path / "answer.txt").write_text("p\n")

    def evaluate(answers: object) -> object:
        task = {"prompt": "q", "hidden": {"answers": answers}}
        return asyncio.run(evaluator.evaluate(EvaluationInput(task=task, workspace=tmp_path)))

    with pytest.raises(EvaluatorError, match=r"hidden\.answers must be a string"):
        evaluate({"P": 1})
    assert evaluate("Paris").reward == 0.0  # control: the same answer against a well-formed task


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({"metric": "EM"}, "em, f1"),
        ({"metric": "accuracy"}, "em, f1"),
        ({"source": "File"}, "file, final_answer"),
    ],
)
def test_an_unknown_metric_or_source_is_refused_naming_the_allowed_values(
    tmp_path: Path, kwargs: dict, allowed: str
) -> None:
    (tmp_path / "answer.txt").write_text("Keth\n")
    with pytest.raises(ConfigError, match=f"evaluator.kwargs.{next(iter(kwargs))} must be one of {allowed}"):
        score_search(_inp(tmp_path), **kwargs)
    assert score_search(_inp(tmp_path), metric="f1", source="file")["reward"] == 1.0  # control


def test_searchqa_drops_blank_golds_keeps_article_only_ones_and_reports_both(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": "a", "question": "which band?", "golden_answers": ["The The", "", " "]},
        {"id": "b", "question": "which river?", "answer": "Keth"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="harnessrl.tasks.search"):
        tasks = load_searchqa(path, split="train")
    assert [t.data["hidden"]["answers"] for t in tasks] == [["The The"], ["Keth"]]
    assert "2 blank gold answers dropped; 1 gold answers are only articles or punctuation" in caplog.text


@pytest.mark.parametrize(
    "golds", [[""], ["  ", ""], "", [True], [{"a": 1}], 7, [["x"]]], ids=lambda g: json.dumps(g)
)
def test_searchqa_refuses_a_row_whose_golds_are_blank_or_not_strings(tmp_path: Path, golds: object) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "golden_answers": golds}) + "\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: needs gold answers"):
        load_searchqa(path, split="train")


@pytest.mark.parametrize(
    "content",
    [
        b'{"question": "q", "answer": "\xff"}\n',
        b'{"question": "q", "answer": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        # Past Python's 4,300-digit limit for int(): json raises a bare ValueError (was a traceback)
        b'{"question": "q", "answer": "a", "n": ' + b"1" * 5_000 + b"}\n",
    ],
    ids=["not-utf8", "deep", "huge-int"],
)
def test_searchqa_refuses_an_unreadable_file_as_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=r"bad\.jsonl"):
        load_searchqa(path, split="train")


@pytest.mark.timeout(60)  # the bug was a hang: fail, do not wait 10 minutes
def test_searchqa_refuses_a_task_file_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO given as the task file held the start forever, waiting for a writer."""
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"train tasks: cannot read .*train\.jsonl.*not a regular file"):
        load_searchqa(fifo, split="train")
    regular = tmp_path / "crlf.jsonl"  # control, with Windows line ends as read_text read them
    regular.write_bytes(
        b'{"id": "a", "question": "q1", "answer": "x"}\r\n{"id": "b", "question": "q2", "answer": "y"}\r\n'
    )
    assert [t.task_id for t in load_searchqa(regular, split="train")] == ["a", "b"]


def test_searchqa_questions_may_hold_line_separators(tmp_path):
    """Rows are split at "\\n" only: ``str.splitlines`` split a question holding U+2028 in two."""
    path = tmp_path / "qa.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"who{ch}wrote x?", "answer": "A"}
        for i, ch in enumerate("\u2028\u2029\x85")
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [t.data["question"] for t in load_searchqa(path, split="train")] == [r["question"] for r in rows]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<answer>Arlen Voss</answer>",
        "<answer> a </answer> then <answer>b</answer>",
        "<answer>a</answer><answer>unclosed",
        "<answer><answer>x</answer>",
        "<answer>multi\nline</answer>",
        "</answer><answer></answer>",
        "<answer>a</answer></answer>",
    ],
)
def test_the_answer_tag_reads_as_the_regex_read_it(text: str) -> None:
    import re

    from harnessrl.tasks.search import extract_answer

    found = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert extract_answer(text) == (found[-1].strip() if found else None)


def test_a_megabyte_of_unclosed_answer_tags_is_one_pass() -> None:
    """The regex took time quadratic in unclosed ``<answer>`` tags (10 s of the controller's GIL at
    128 KiB; this input: about ten minutes, past the evaluator's timeout, which the controller
    counts as an infrastructure failure): the policy could turn its 0 into "not counted"."""
    from harnessrl.tasks.search import extract_answer

    text = "<answer>Arlen Voss</answer>" + "<answer>" * ((1 << 20) // 8)
    assert extract_answer(text) == "Arlen Voss"
    calls = [
        _reply_call("<answer>" * ((1 << 20) // 8)),
    ]
    inp = SimpleNamespace(task={"hidden": {"answers": ["Arlen Voss"]}}, workspace="/nonexistent", calls=calls)
    assert score_search(inp, source="final_answer")["reward"] == 0.0


def _reply_call(text: str):
    from harnessrl.schemas import Call

    return Call(rollout_id="r", seq=0, response={"choices": [{"message": {"content": text}}]},
                prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[0.0])  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hops", "1,x"], "--hops: comma-separated hop counts among 1, 2, 3, got '1,x'"),
        (["--hops", "4"], "hops must be among 1, 2, 3, got [4]"),
        (["--train", "-1"], "--train and --heldout must be >= 0"),
        (["--hops", "0,1"], "hops must be among 1, 2, 3, got [0, 1]"),
    ],
)
def test_the_dataset_command_refuses_bad_options_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    """A ValueError traceback (exit 1) before, after the corpus was already written."""
    from harnessrl.tasks.search import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(out), "--train", "5", "--heldout", "5", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.timeout(60)  # the bug was a hang (hours of draws): fail, do not wait 10 minutes
def test_more_questions_than_the_world_holds_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--train 100000`` (Search-R1's scale) drew questions for hours before its ValueError: the
    world holds 12,544 distinct training questions. Now exit 2 at once, naming both numbers."""
    from harnessrl.tasks.search import main

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(out), "--train", "100000"])
    assert exit_.value.code == 2
    assert (
        "only 12544 distinct train questions exist for these settings, not 100000" in capsys.readouterr().err
    )
    assert not out.exists()
    every = len({t["prompt"] for t in make_questions(WORLD, "heldout", 330)})  # control: all of them
    assert every == 330
    with pytest.raises(ValueError, match="only 330 distinct heldout questions"):
        make_questions(WORLD, "heldout", 331)
    with pytest.raises(ValueError, match="only 170 distinct heldout questions"):  # 1-hop templates only
        make_questions(WORLD, "heldout", 171, hops=(1,))


@pytest.mark.parametrize(
    ("wrong", "gold"),
    [
        ("35", "3.5"),
        ("12", "1.2"),
        ("35 million", "3.5 million"),
        ("40", "-40"),
        ("5", ".5"),
        ("40", "−40"),
        ("1000", "1e-3"),
    ],
)
def test_a_number_keeps_its_decimal_point_and_sign(tmp_path: Path, wrong: str, gold: str) -> None:
    """Search-R1's normalisation dropped every punctuation mark: "35" scored 1.0 on the gold "3.5"
    and "40" on "-40" (a wrong answer paid as right)."""
    (tmp_path / "answer.txt").write_text(f"{wrong}\n")
    result = score_search(_inp(tmp_path, [gold]))
    assert (result["reward"], result["em"]) == (0.0, 0.0)
    assert f1(wrong, [gold]) < 1.0
    (tmp_path / "answer.txt").write_text(f"{gold}.\n")  # control: the gold itself, a period after it
    assert score_search(_inp(tmp_path, [gold]))["reward"] == 1.0


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("2.5", "2.50"), ("1000", "1e3"), ("1850.0", "1850"), ("$3.50", "3.5"), ("0.5", ".5"), ("-0.5", "−.5")],
)
def test_the_same_number_written_otherwise_matches(tmp_path: Path, answer: str, gold: str) -> None:
    """A numeric gold read as written ("2.50", "1e3") was matched only by that spelling: "2.5" and
    "1000" scored 0. Equal values match, as exact_match's do (never nearly equal ones)."""
    (tmp_path / "answer.txt").write_text(f"{answer}\n")
    assert score_search(_inp(tmp_path, [gold])) == {"reward": 1.0, "em": 1.0, "f1": 1.0, "answer": answer}
    assert score_search(_inp(tmp_path, [gold]), metric="f1")["reward"] == 1.0
    (tmp_path / "answer.txt").write_text(f"{answer}1\n")  # control: another number
    assert score_search(_inp(tmp_path, [gold]))["reward"] == 0.0


def test_search_r1_normalisation_is_kept_away_from_numbers() -> None:
    assert exact_match("The X-Ray, U.S.", ["xray us"]) == 1.0
    assert exact_match("1,850", ["1850"]) == exact_match("1850-1900", ["18501900"]) == 1.0
    assert exact_match("3.5.", ["3.5"]) == 1.0  # a trailing period is no decimal point


@pytest.mark.parametrize("row_id", ["nq\u0000-1", "nq-\ud800"], ids=["nul", "surrogate"])
def test_searchqa_refuses_an_id_no_store_can_keep(tmp_path: Path, row_id: str) -> None:
    """Loaded before; every store refuses such a task id (store.codecs), once the run is under way."""
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": row_id, "question": "q", "answer": "a"}) + "\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: 'id' must not contain NUL or lone surrogate"):
        load_searchqa(path, split="train")
    path.write_text(json.dumps({"id": "nq-1", "question": "q\u0000", "answer": "a"}) + "\n")  # control
    assert [t.task_id for t in load_searchqa(path, split="train")] == ["nq-1"]


def test_a_megabytes_long_answer_is_not_scored_in_the_controller() -> None:
    """Normalising the policy's ``<answer>`` ran in the controller at ~1 s per MB (F1 ~3 s, with C
    calls holding the GIL a second at a time): 2 MB of `` .`` padding around the gold was worth 1
    after seconds of work, and a longer reply ran past ``evaluator.timeout_s``, an infrastructure
    failure the policy chose. Now an answer past 4,096 characters is 0 flagged ``answer_too_long``."""
    padded = "<answer>Arlen Voss" + " ." * 1_000_000 + "</answer>"
    task = {"hidden": {"answers": ["Arlen Voss"]}}
    inp = SimpleNamespace(task=task, workspace="/nonexistent", calls=[_reply_call(padded)])
    for metric in ("em", "f1"):
        result = score_search(inp, source="final_answer", metric=metric)
        assert (result["reward"], result["flags"], len(result["answer"])) == (0.0, ["answer_too_long"], 4096)
    # Control: the gold itself, and an answer as long as the limit, are scored as before.
    inp = SimpleNamespace(
        task=task, workspace="/nonexistent", calls=[_reply_call("<answer>Arlen Voss.</answer>")]
    )
    assert score_search(inp, source="final_answer")["reward"] == 1.0
    at_limit = "<answer>Arlen Voss" + " ." * 2039 + "</answer>"  # 4,088 characters
    inp = SimpleNamespace(task=task, workspace="/nonexistent", calls=[_reply_call(at_limit)])
    assert "flags" not in score_search(inp, source="final_answer")
