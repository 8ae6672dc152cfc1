"""Search tasks: a generated encyclopedia of fictional entities, multi-hop questions, Search-R1 data.

- ``make_world(seed, ...)``: a deterministic world of fictional countries, cities, people and
  organizations with attributes and links between them (a city's founder is a person, a person's
  birthplace is a city...). No name or fact comes from the real world, so a model cannot answer from
  memory: it must retrieve. Entities are split into a training part and a held-out part, and links
  never cross the split, so a held-out question's whole chain is about entities no training question
  ever touches.
- ``corpus_passages(world)``: the encyclopedia as passages (one for each place and organization, two
  for each person), the corpus ``[retrieval]`` indexes.
- ``make_questions(world, split, ...)``: questions answered by following 1, 2 or 3 links, each needing
  one retrieval per link ("In which country was the founder of Orvane Works born?" = organization ->
  founder -> birthplace -> country).
- ``load_searchqa(path)``: tasks from the Search-R1 / FlashRAG / NQ-open / HotpotQA JSONL layouts
  (``question`` plus ``golden_answers``, ``answer``, ``answers`` or ``reward_model.ground_truth.target``),
  so a user with those files and the wiki-18 corpus runs the paper's setup.
- ``score_search``: the reward, exact match (or F1) of the normalised answer against any gold answer,
  with Search-R1's normalisation (lower case, no punctuation, no articles, single spaces). Where this
  departs from Search-R1: a gold that the normalisation empties ("The The", "A", "!") is matched on
  case and spaces only, so an empty-ish answer ("the", ".") never matches it; a blank gold never
  matches; ``hidden.answers`` as one string is one answer, not its characters; a number keeps its
  decimal point and leading minus (``35`` is not ``3.5``, ``40`` not ``-40``), and two plain
  numbers match when their values are equal (``2.5`` and ``2.50``, ``1000`` and ``1e3``).

Run ``python -m harnessrl.tasks.search --out DIR`` to write ``corpus.jsonl``, ``train.jsonl`` and
``heldout.jsonl`` (docs/retrieval.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harnessrl.errors import ConfigError
from harnessrl.input_files import read_regular
from harnessrl.schemas import Task
from harnessrl.tasks.agent_files import read_agent_file
from harnessrl.tasks.answers import as_number, final_answer_text
from harnessrl.tasks.fields import HIDDEN

log = logging.getLogger(__name__)

# -- the world ------------------------------------------------------------------------------------

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr",
           "kr", "tr", "th", "sh", "ch", "st", "vr", "qu", "h", "j", "y"]  # fmt: skip
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "nd", "rk", "x", "m", "sk", "v"]
OCCUPATIONS = ["cartographer", "glassblower", "astronomer", "shipwright", "archivist", "beekeeper",
               "clockmaker", "botanist", "mason", "translator", "brewer", "physician", "weaver",
               "surveyor", "violinist", "engraver", "potter", "tanner", "chemist", "lighthouse keeper"]  # fmt: skip
INDUSTRIES = ["shipping", "mining", "textiles", "printing", "glassworks", "timber", "salt trading",
              "brewing", "instrument making", "banking", "insurance", "railways"]  # fmt: skip
_ORG_SUFFIXES = ["Works", "Company", "Guild", "Foundry", "Trading House", "Society", "Mills", "Bank"]


def _name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


@dataclass
class Entity:
    key: str  # "person:12"
    kind: Literal["country", "city", "person", "org"]
    name: str
    part: Literal["train", "heldout"]
    attrs: dict[str, Any] = field(default_factory=dict)  # values: str, int, or another entity's key


@dataclass
class World:
    seed: int
    entities: dict[str, Entity]

    def of(self, kind: str, part: str) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == kind and e.part == part]

    def name(self, value: Any) -> str:
        return self.entities[value].name if isinstance(value, str) and value in self.entities else str(value)


def make_world(
    seed: int = 0,
    *,
    countries: int = 60,
    cities: int = 500,
    people: int = 1200,
    orgs: int = 400,
    heldout_share: float = 0.2,
) -> World:
    """A deterministic world: same arguments, same entities, names and facts."""
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh(make: Any) -> str:
        while True:
            candidate = make()
            if candidate.lower() not in used:
                used.add(candidate.lower())
                return candidate

    entities: dict[str, Entity] = {}
    counts = {"country": countries, "city": cities, "person": people, "org": orgs}
    for kind, n in counts.items():
        for i in range(n):
            part: Literal["train", "heldout"] = "heldout" if i < round(n * heldout_share) else "train"
            if kind == "person":
                name = fresh(lambda: f"{_name(rng, 2).title()} {_name(rng, 2).title()}")
            elif kind == "org":
                name = fresh(lambda: f"{_name(rng, 2).title()} {rng.choice(_ORG_SUFFIXES)}")
            elif kind == "country":
                name = fresh(lambda: _name(rng, 2).title() + rng.choice(["ia", "land", "mark", "stan", ""]))
            else:
                name = fresh(lambda: _name(rng, 2).title())
            entities[f"{kind}:{i}"] = Entity(f"{kind}:{i}", kind, name, part)  # type: ignore[arg-type]
    world = World(seed, entities)
    for part in ("train", "heldout"):
        c_countries, c_cities = world.of("country", part), world.of("city", part)
        c_people, c_orgs = world.of("person", part), world.of("org", part)
        for country in c_countries:
            country.attrs = {
                "capital": None,  # set below from its cities
                "founded": rng.randint(900, 1700),
                "language": _name(rng, 2).title() + "ish",
            }
        for city in c_cities:
            city.attrs = {
                "country": rng.choice(c_countries).key,
                "founded": rng.randint(1000, 1850),
                "founder": rng.choice(c_people).key,
                "river": "the " + _name(rng, 2).title(),
            }
        for country in c_countries:
            own = [c for c in c_cities if c.attrs["country"] == country.key]
            country.attrs["capital"] = rng.choice(own).key if own else rng.choice(c_cities).key
        for person in c_people:
            person.attrs = {
                "born": rng.randint(1700, 1990),
                "birthplace": rng.choice(c_cities).key,
                "occupation": rng.choice(OCCUPATIONS),
                "employer": rng.choice(c_orgs).key,
            }
        for org in c_orgs:
            org.attrs = {
                "founded": rng.randint(1750, 2000),
                "headquarters": rng.choice(c_cities).key,
                "founder": rng.choice(c_people).key,
                "industry": rng.choice(INDUSTRIES),
            }
    return world


# -- the encyclopedia -----------------------------------------------------------------------------


def corpus_passages(world: World) -> list[dict[str, str]]:
    """The encyclopedia: ``{"id", "title", "text"}`` passages, in a fixed order."""
    n = world.name
    out: list[dict[str, str]] = []
    for e in world.entities.values():
        a = e.attrs
        if e.kind == "country":
            texts = [
                f"{e.name} is a country. Its capital is {n(a['capital'])}. {e.name} was founded in "
                f"{a['founded']}, and its people speak {a['language']}."
            ]
        elif e.kind == "city":
            texts = [
                f"{e.name} is a city in {n(a['country'])}. It was founded in {a['founded']} by "
                f"{n(a['founder'])}. The river {a['river'][4:]} flows through {e.name}."
            ]
        elif e.kind == "org":
            texts = [
                f"{e.name} is an organization in {a['industry']}. It was founded in {a['founded']} by "
                f"{n(a['founder'])} and is headquartered in {n(a['headquarters'])}."
            ]
        else:
            texts = [
                f"{e.name} is a {a['occupation']}. {e.name} was born in {a['born']} in {n(a['birthplace'])}.",
                f"{e.name} works for {n(a['employer'])}, an organization in "
                f"{world.entities[a['employer']].attrs['industry']}.",
            ]
        for i, text in enumerate(texts):
            out.append({"id": f"{e.key.replace(':', '-')}-{i}", "title": e.name, "text": text})
    return out


# -- questions ------------------------------------------------------------------------------------

# (kind of the subject, path of attributes, question template): the template names the subject as {s}.
# One retrieval per attribute on the path: the subject's passage gives the first link, and so on.
_TEMPLATES: list[tuple[str, tuple[str, ...], str]] = [
    ("city", ("founded",), "In what year was {s} founded?"),
    ("city", ("founder",), "Who founded the city of {s}?"),
    ("city", ("country",), "In which country is the city of {s}?"),
    ("city", ("river",), "Which river flows through {s}?"),
    ("person", ("born",), "In what year was {s} born?"),
    ("person", ("birthplace",), "In which city was {s} born?"),
    ("person", ("occupation",), "What is the occupation of {s}?"),
    ("person", ("employer",), "Which organization does {s} work for?"),
    ("org", ("founded",), "In what year was {s} founded?"),
    ("org", ("headquarters",), "In which city is {s} headquartered?"),
    ("org", ("founder",), "Who founded {s}?"),
    ("country", ("capital",), "What is the capital of {s}?"),
    ("city", ("founder", "born"), "In what year was the founder of {s} born?"),
    ("city", ("founder", "occupation"), "What is the occupation of the person who founded {s}?"),
    ("person", ("birthplace", "country"), "In which country was {s} born?"),
    ("person", ("employer", "founded"), "In what year was the organization {s} works for founded?"),
    ("person", ("birthplace", "founded"), "In what year was the birthplace of {s} founded?"),
    ("org", ("headquarters", "country"), "In which country is {s} headquartered?"),
    ("org", ("founder", "birthplace"), "In which city was the founder of {s} born?"),
    ("country", ("capital", "founder"), "Who founded the capital of {s}?"),
    ("org", ("founder", "birthplace", "country"), "In which country was the founder of {s} born?"),
    ("city", ("founder", "birthplace", "river"), "Which river flows through the birthplace of the founder of {s}?"),
    ("person", ("employer", "headquarters", "country"), "In which country is the organization {s} works for headquartered?"),
    ("country", ("capital", "founder", "born"), "In what year was the founder of the capital of {s} born?"),
]  # fmt: skip


def make_questions(
    world: World,
    part: Literal["train", "heldout"],
    count: int,
    *,
    seed: int = 0,
    hops: Sequence[int] = (1, 2, 3),
    hop_weights: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """``count`` tasks about ``part``'s entities, distinct questions, each needing ``len(path)``
    retrievals. A task: ``{"task_id", "prompt", "hops", "hidden": {"answers", "path"}}``."""
    rng = random.Random(f"{world.seed}-{part}-{seed}")
    weights = list(hop_weights) if hop_weights is not None else [1.0] * len(hops)
    templates = {h: [t for t in _TEMPLATES if len(t[1]) == h] for h in hops}
    if any(not templates[h] for h in hops):
        raise ValueError(f"hops must be among 1, 2, 3, got {list(hops)}")
    # Every subject of a template's kind asks a question of its own (names are unique across kinds).
    # Checked first: past it the draws below never end in time (--train 100000: hours, not an error).
    drawn = {h for h, weight in zip(hops, weights, strict=False) if weight > 0}
    distinct = sum(len(world.of(t[0], part)) for h in drawn for t in templates[h])
    if count > distinct:
        raise ValueError(f"only {distinct} distinct {part} questions exist for these settings, not {count}")
    seen: set[str] = set()
    tasks: list[dict[str, Any]] = []
    attempts = 0
    while len(tasks) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(f"only {len(tasks)} distinct {part} questions exist for these settings")
        hop = rng.choices(list(hops), weights)[0]
        kind, path, template = rng.choice(templates[hop])
        subject = rng.choice(world.of(kind, part))
        value: Any = subject.key
        chain = [subject.name]
        for attribute in path:
            value = world.entities[value].attrs[attribute]
            chain.append(world.name(value))
        question = template.format(s=subject.name)
        if question in seen:
            continue
        seen.add(question)
        answer = world.name(value)
        answers = [answer, answer[4:]] if answer.startswith("the ") else [answer]
        tasks.append(
            {
                "task_id": f"{part}-{len(tasks):05d}",
                "prompt": question,
                "hops": hop,
                HIDDEN: {"answers": answers, "path": chain},
            }
        )
    return tasks


def write_dataset(
    out: Path,
    *,
    seed: int = 0,
    train: int = 2000,
    heldout: int = 200,
    hops: Sequence[int] = (1, 2, 3),
    suffix: str = "",
) -> dict[str, Any]:
    """``corpus.jsonl``, ``train{suffix}.jsonl`` and ``heldout{suffix}.jsonl`` in ``out``; returns
    their counts. The corpus depends on ``seed`` only, so question sets with other hops share it."""
    world = make_world(seed)
    passages = corpus_passages(world)
    splits = {"train": make_questions(world, "train", train, hops=hops)}
    splits["heldout"] = make_questions(world, "heldout", heldout, hops=hops)
    out.mkdir(parents=True, exist_ok=True)  # only once the questions exist: a ValueError writes nothing
    _write_jsonl(out / "corpus.jsonl", passages)
    for name, rows in splits.items():
        _write_jsonl(out / f"{name}{suffix}.jsonl", rows)
    return {
        "passages": len(passages),
        **{f"{name}_questions": len(rows) for name, rows in splits.items()},
        **{f"{name}_hops": dict(Counter(r["hops"] for r in rows)) for name, rows in splits.items()},
    }


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


# -- Search-R1 / NQ / HotpotQA layouts ------------------------------------------------------------


def gold_answers(value: Any, *, name: str = "hidden.answers") -> list[str]:
    """A task's gold answers as strings: one string is one answer (never its characters); a list
    holds strings (or numbers: ``load_searchqa`` keeps a file's as written; a float already parsed
    reads as Python writes it, ``2.5`` — write such golds as strings). Anything else is the task's error (``ConfigError``).
    A blank gold (``""``, spaces) is dropped: nothing can match it."""
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)
    ):
        raise ConfigError(f"{name} must be a string or a non-empty list of strings, got {_preview(value)}")
    golds = [str(v) for v in value]
    kept = [g for g in golds if g.strip()]
    if not kept:
        raise ConfigError(f"{name} holds no answer that is not blank: {_preview(value)}")
    return kept


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _raw_golds(row: dict[str, Any]) -> Any:
    for key in ("golden_answers", "answers", "answer"):
        if key in row:
            return row[key]
    # Each level only when it is an object: a ``reward_model`` or ``ground_truth`` written as a string
    # or a list (``.get`` on it) was an AttributeError's traceback, not the row's named error.
    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    return ground_truth.get("target") if isinstance(ground_truth, dict) else None


def load_searchqa(path: Path, *, split: str) -> list[Task]:
    """Tasks from a question-answering JSONL file (Search-R1 / FlashRAG ``{"id", "question",
    "golden_answers"}``, NQ-open ``{"question", "answer": [...]}``, HotpotQA ``{"_id", "question",
    "answer"}``, Search-R1's processed rows with ``reward_model.ground_truth.target``). The answers go
    under ``hidden``; only the question reaches the harness (as ``prompt`` and ``question``)."""
    try:
        text = read_regular(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{split} tasks: cannot read {path}: {exc}") from exc
    # Newlines as read_text read them ("\r\n" and "\r" are "\n"); not splitlines: U+2028 may sit in
    # a string.
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    tasks: list[Task] = []
    seen: set[str] = set()
    blank = loose = 0  # gold answers dropped as blank; kept but only articles or punctuation
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{split} tasks: {path}:{lineno}"
        try:
            # Numbers as written: json's floats made the gold "2.50" "2.5" and "1e3" "1000.0", which
            # no answer "2.50" or "1000" could match.
            row = json.loads(line, parse_float=str)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON: {exc}") from exc
        except ValueError as exc:  # JSON Python's parser refuses: an integer of over 4,300 digits
            raise ConfigError(f"{where}: cannot be read: {exc}") from None
        except RecursionError:
            raise ConfigError(f"{where}: nested too deeply to read") from None
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("question"), str)
            or not row["question"].strip()
        ):
            raise ConfigError(f"{where}: needs a 'question' string")
        raw = _raw_golds(row)
        try:
            golds = gold_answers(raw, name="the gold answers")
        except ConfigError as exc:
            raise ConfigError(
                f"{where}: needs gold answers ('golden_answers', 'answers', 'answer' or "
                f"'reward_model.ground_truth.target'); {exc}"
            ) from None
        blank += (len(raw) if isinstance(raw, list) else 1) - len(golds)
        loose += sum(1 for g in golds if not normalize(g))
        id_field = "id" if "id" in row else "_id" if "_id" in row else None
        raw_id = row[id_field] if id_field else f"{path.stem}-{lineno}"
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or not str(raw_id).strip():
            # null was the id "None" (two such rows: "appears twice"), a list its repr
            raise ConfigError(
                f"{where}: {id_field!r} must be a non-empty string or an integer, got {_preview(raw_id)}"
            )
        task_id = str(raw_id)
        if _UNSTORABLE.search(task_id):  # every store refuses such an id, once the run is under way
            raise ConfigError(
                f"{where}: {id_field!r} must not contain NUL or lone surrogate characters, got {task_id[:60]!r}"
            )
        if task_id in seen:
            raise ConfigError(f"{where}: task id {task_id!r} appears twice")
        seen.add(task_id)
        question = row["question"].strip()
        data: dict[str, Any] = {"prompt": question, "question": question, HIDDEN: {"answers": golds}}
        if "hops" in row:
            data["hops"] = row["hops"]
        tasks.append(Task(task_id=task_id, split=split, data=data))
    if blank or loose:
        log.warning(
            "%s tasks: %s: %d blank gold answers dropped; %d gold answers are only articles or "
            "punctuation (like 'The The'), so they are matched on case and spaces only (score_search)",
            split,
            path,
            blank,
            loose,
        )
    return tasks


# -- scoring --------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # in an id: no store keeps it (store.codecs)
_PUNCTUATION = set(string.punctuation)
_DIGITS = frozenset("0123456789")
_MINUS_SIGN = "\u2212"  # U+2212, the typeset minus: read as "-"
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
ANSWER_FILE = "answer.txt"
_MAX_ANSWER_BYTES = 4096
# An answer in the reply longer than this (or than 4 times the longest gold) is no answer: scoring
# it ran in the controller at ~1 s per MB of the policy's text (F1: ~3 s; its C calls held the GIL
# for 1 s at 4.5 MB, stalling the event loop), and past evaluator.timeout_s the policy had turned its
# 0 into an infrastructure failure ("not counted"). answer.txt is read only this far already.
_MAX_ANSWER_CHARS = 4096
TOO_LONG = "answer_too_long"  # the flag of such an answer


def normalize(text: str) -> str:
    """Search-R1's (and SQuAD's) answer normalisation, except that a number keeps its sign and its
    decimal point (``_in_number``): dropping them made ``35`` the answer to the gold ``3.5``
    (``35 million`` to ``3.5 million``) and ``40`` the answer to ``-40``."""
    text = text.lower().replace(_MINUS_SIGN, "-")
    kept = (ch for i, ch in enumerate(text) if ch not in _PUNCTUATION or _in_number(text, i))
    return " ".join(_ARTICLES.sub(" ", "".join(kept)).split())


def _in_number(text: str, i: int) -> bool:
    """Whether ``text[i]`` is a number's decimal point (``3.5``, ``.5``) or leading minus (``-40``,
    ``-.5``, ``1e-3``): a ``.`` before a digit, after a digit or at a word's start; a ``-`` at a
    word's start before a digit or a decimal point, or in an exponent. A ``-`` between words or
    digits (``1850-1900``) is dropped."""
    ch = text[i]
    before = text[i - 1] if i > 0 else " "
    after = text[i + 1] if i + 1 < len(text) else " "
    if ch == ".":
        return after in _DIGITS and (before in _DIGITS or before.isspace() or before == "-")
    if ch == "-":
        if before == "e" and i > 1 and text[i - 2] in _DIGITS and after in _DIGITS:
            return True  # an exponent's: 1e-3 is not 1e3
        starts = before.isspace()
        return starts and (after in _DIGITS or (after == "." and text[i + 2 : i + 3] in _DIGITS))
    return False


def _light(text: str) -> str:
    """Case and whitespace only: the normalisation of a gold that ``normalize`` empties."""
    return " ".join(text.lower().split())


def _matches(prediction: str, gold: str) -> bool:
    g = normalize(gold)
    if g:  # an answer that normalises to nothing ("the", ".", '""') never equals it
        p = normalize(prediction)
        if p == g:
            return True
        # Both a plain number: equal values match (2.5 and 2.50, 1850.0 and 1850, 1e3 and 1000).
        x, y = as_number(p), as_number(g)
        return x is not None and y is not None and x == y
    # A gold that is only articles or punctuation ("The The", "A", "!") normalises to nothing, as
    # every empty-ish answer does: it is matched on case and whitespace only, and a blank gold never.
    light = _light(gold)
    return bool(light) and _light(prediction) == light


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    return 1.0 if any(_matches(prediction, g) for g in golds) else 0.0


def f1(prediction: str, golds: Sequence[str]) -> float:
    best = 0.0
    p = normalize(prediction).split()
    for gold in golds:
        if _matches(prediction, gold):  # equal, or the same number written otherwise (2.5, 2.50)
            best = 1.0
            continue
        g = normalize(gold).split()
        if not g:  # only articles or punctuation: all or nothing, as exact match (no partial "the")
            best = max(best, 1.0 if _matches(prediction, gold) else 0.0)
            continue
        common = sum((Counter(p) & Counter(g)).values())
        if common:
            precision, recall = common / len(p), common / len(g)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def read_answer_file(workspace: Path) -> str | None:
    """The first line of ``answer.txt`` in the (hostile) workspace: never through a link, never more
    than 4 KiB, and only from a regular file. Anything else there (a directory, a FIFO, a socket, a
    link) or any error reading it is no answer (``None``), never an exception: an exception is the
    scorer's failure, which the controller leaves out of the baseline and retries, so the agent could
    turn its 0 into "not counted" by what it leaves in its workspace."""
    try:
        data = read_agent_file(workspace / ANSWER_FILE, _MAX_ANSWER_BYTES)
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    lines = [line.strip().strip("\"'") for line in text.splitlines() if line.strip()]
    return lines[0] if lines else None


def extract_answer(text: str) -> str | None:
    """The last ``<answer>…</answer>`` of a reply (Search-R1's format), else None: what the last
    match of ``<answer>(.*?)</answer>`` holds, found in one pass (the regex took time quadratic in
    the unclosed ``<answer>`` tags of the policy's reply: 128 KiB of them held the GIL for 10 s, and
    a bigger reply ran past the evaluator's timeout, an infrastructure failure the policy chose)."""
    found, position = None, 0
    while (start := text.find(_ANSWER_OPEN, position)) >= 0:
        end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
        if end < 0:
            break
        found = text[start + len(_ANSWER_OPEN) : end]
        position = end + len(_ANSWER_CLOSE)
    return found.strip() if found is not None else None


SOURCES = ("file", "final_answer")
METRICS = ("em", "f1")


def score_search(
    inp: Any, *, source: Literal["file", "final_answer"] = "file", metric: Literal["em", "f1"] = "em"
) -> dict[str, Any]:
    """A ``python`` evaluator (``function = "harnessrl.tasks.search:score_search"``): the answer from
    ``answer.txt`` in the workspace (``source = "file"``: what a shell harness writes) or from the last
    ``<answer>…</answer>`` of the final assistant text (``"final_answer"``); reward = exact match
    (``metric = "em"``) or F1 (``"f1"``) against the task's ``hidden.answers``. An answer longer
    than 4,096 characters (and than 4 times the longest gold) is not scored: 0, flagged
    ``answer_too_long``.

    An unknown ``source`` or ``metric``, or ``hidden.answers`` that is not a string or a list of
    strings, raises ``ConfigError`` (the python evaluator reports it as the evaluator's failure, not
    the policy's): the run's or the task's fault, never read as some other setting."""
    if source not in SOURCES:
        raise ConfigError(f"evaluator.kwargs.source must be one of {', '.join(SOURCES)}; got {source!r}")
    if metric not in METRICS:
        raise ConfigError(f"evaluator.kwargs.metric must be one of {', '.join(METRICS)}; got {metric!r}")
    hidden = inp.task.get(HIDDEN)
    if not isinstance(hidden, dict) or "answers" not in hidden:
        raise ConfigError("the task has no hidden.answers")
    golds = gold_answers(hidden["answers"])
    if source == "file":
        answer = read_answer_file(Path(inp.workspace))
    else:
        answer = extract_answer(final_answer_text(inp.calls))
    if answer is not None and len(answer) > max(_MAX_ANSWER_CHARS, 4 * max(map(len, golds), default=0)):
        return {
            "reward": 0.0,
            "em": 0.0,
            "f1": 0.0,
            "answer": answer[:_MAX_ANSWER_CHARS],
            "flags": [TOO_LONG],
        }
    em = exact_match(answer, golds) if answer is not None else 0.0
    f = f1(answer, golds) if answer is not None else 0.0
    return {"reward": em if metric == "em" else f, "em": em, "f1": round(f, 4), "answer": answer}


def _check_search_task(
    task: Mapping[str, Any], *, source: Any = "file", metric: Any = "em", **unknown: Any
) -> None:
    """What ``score_search`` needs, checked for every task before a run starts
    (``PythonEvaluatorConfig.check_task``): known ``source`` and ``metric`` kwargs and no others, and
    gold answers under ``hidden.answers``. Without it a task lacking them was an infrastructure failure
    at every attempt, and a mistyped ``metric`` was found on the first rollout scored; a misspelt
    kwarg's name (``metirc``) was a ``TypeError``'s traceback from the command that checked it."""
    if unknown:
        raise ConfigError(
            f"evaluator.kwargs: score_search takes only source and metric; got {', '.join(sorted(unknown))}"
        )
    if source not in SOURCES:
        raise ConfigError(f"evaluator.kwargs.source must be one of {', '.join(SOURCES)}; got {source!r}")
    if metric not in METRICS:
        raise ConfigError(f"evaluator.kwargs.metric must be one of {', '.join(METRICS)}; got {metric!r}")
    hidden = task.get(HIDDEN)
    if not isinstance(hidden, dict) or "answers" not in hidden:
        raise ConfigError("the task has no hidden.answers (the gold answers score_search compares with)")
    gold_answers(hidden["answers"])


score_search.check_task = _check_search_task  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harnessrl.tasks.search",
        description="Write the fictional encyclopedia and its questions.",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--heldout", type=int, default=200)
    parser.add_argument("--hops", default="1,2,3", help="comma-separated hop counts to draw from")
    parser.add_argument("--suffix", default="", help="train{suffix}.jsonl, heldout{suffix}.jsonl")
    args = parser.parse_args(argv)
    try:
        hops = tuple(int(h) for h in args.hops.split(","))
    except ValueError:
        parser.error(f"--hops: comma-separated hop counts among 1, 2, 3, got {args.hops!r}")
    if args.train < 0 or args.heldout < 0:
        parser.error("--train and --heldout must be >= 0")
    try:
        counts = write_dataset(
            args.out, seed=args.seed, train=args.train, heldout=args.heldout, hops=hops, suffix=args.suffix
        )
    except ValueError as exc:  # hops outside 1-3, more questions than the world holds: exit 2, one line
        parser.error(str(exc))
    except OSError as exc:  # --out is a file, under one, or not writable: exit 2 naming it, no traceback
        parser.error(f"--out / --suffix: cannot write the dataset into {args.out}: {exc}")
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
