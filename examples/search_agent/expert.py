"""A scripted expert teacher for the search agent: mini-swe-agent's text actions, served as an
OpenAI-compatible chat.completions server.

**A scripted expert, not a model.** Offline there is no strong model to distil, so this stands in for
one: it answers each call as a capable model would through mini-swe-agent with ``mini_search.yaml``.
It reads **only the conversation it is sent**: the question in the first user message (parsed with
the question wordings of ``harnessrl.tasks.search``) and the passages the ``search`` command printed
in the observations since. It never reads the corpus, the data files or the task's ``hidden``
answers; every entity name it uses after the question comes out of a returned passage.

Each reply is one action, a bare ```` ```bash ```` block as ``mini_search.yaml``'s worked examples
show (no THOUGHT line: the student's answers are capped at 48 tokens there):

1. one ``search "<sub-question>"`` per hop: for the question's first link the question about the
   subject ("In which country was the founder of Orvane Works born?" asks "Who founded Orvane
   Works?" first; a one-hop question is searched as it is, as the prompt teaches), then the question
   about the entity the last passage named ("In which city was Treinmam Maemlusk born?"...). If the
   passage about that entity is not among the results, one more search with its name alone;
2. ``echo "<answer>" > answer.txt``: the task's reward reads answer.txt's first line (exact match,
   ``score_search``);
3. ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` if it is called again (mini-swe-agent's own way to
   finish; with ``mini_search.yaml``'s ``step_limit: 2`` a one-hop rollout ends after step 2 anyway).

A question it does not recognise, or a fact no search found, gets a plain answer with no action (such
a rollout earns nothing, so sft leaves it out).

With network, point ``[engine.teacher]`` at any real provider instead (README.md, "Distill, then
RL"); nothing else changes.

    python examples/search_agent/expert.py --port 8765     # http://127.0.0.1:8765/v1, until Ctrl-C
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any, NamedTuple

from starlette.applications import Starlette

from harnessrl.tasks.search import _TEMPLATES as QUESTION_WORDINGS  # (kind, path, "… {s} …")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the shared server
from expert_server import create_server, serve, text_of  # noqa: E402

MODEL = "search-expert"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

# Most specific wording first: "In what year was the founder of {s} born?" before "In what year was
# {s} born?", whose {s} would otherwise swallow "the founder of X".
_QUESTIONS = [
    (re.compile(re.escape(template).replace(re.escape("{s}"), "(.+?)") + r"\Z"), kind, path)
    for kind, path, template in sorted(QUESTION_WORDINGS, key=lambda t: -len(t[2]))
]
# The one-link question about an entity of a kind: what a hop searches for.
_ASK = {(kind, path[0]): template for kind, path, template in QUESTION_WORDINGS if len(path) == 1}
# The kind of entity a link leads to.
_LINK_KIND = {"founder": "person", "birthplace": "city", "employer": "org", "headquarters": "city",
              "country": "country", "capital": "city"}  # fmt: skip

# What a passage says, one pattern per passage wording of the encyclopedia (corpus_passages). A name
# or a word is `[^.,\n]+` and the end is not anchored: mini_search.yaml's observation glues its
# "Task: ..." line to the last passage when the output lost its final newline.
_W = r"[^.,\n]+"
_FACTS = [
    re.compile(
        rf"(?P<name>{_W}) is a country\. Its capital is (?P<capital>{_W})\. (?P=name) was founded in "
        rf"(?P<founded>\d+), and its people speak (?P<language>{_W})\."
    ),
    re.compile(
        rf"(?P<name>{_W}) is a city in (?P<country>{_W})\. It was founded in (?P<founded>\d+) by "
        rf"(?P<founder>{_W})\. The river (?P<river>{_W}) flows through (?P=name)\."
    ),
    re.compile(
        rf"(?P<name>{_W}) is an organization in (?P<industry>{_W})\. It was founded in (?P<founded>\d+) "
        rf"by (?P<founder>{_W}) and is headquartered in (?P<headquarters>{_W})\."
    ),
    re.compile(
        rf"(?P<name>{_W}) is an? (?P<occupation>{_W})\. (?P=name) was born in (?P<born>\d+) in "
        rf"(?P<birthplace>{_W})\."
    ),
    re.compile(rf"(?P<name>{_W}) works for (?P<employer>{_W}), an organization in (?P<industry>{_W})\."),
]
_PASSAGE = re.compile(r"^\[\d+\] (?P<title>.+)\n(?P<text>.+)$", re.MULTILINE)  # the `search` output
_ACTION = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)\n```", re.DOTALL)
_SEARCH = re.compile(r'search "(.*)"\Z')


def task_line(first_user: str) -> str:
    """The line of the prompt that states the task: the last "Task: ..." line (mini_search.yaml's
    worked examples come before it and are not the task), else the whole prompt."""
    lines = [line.strip() for line in first_user.strip().splitlines() if line.strip()]
    tasks = [line for line in lines if line.startswith("Task:")]
    return tasks[-1] if tasks else " ".join(lines)


def parse_question(first_user: str) -> tuple[str, str, tuple[str, ...], str] | None:
    """``(subject, kind, path, question)`` of the task if it is worded as a question of the dataset
    (mini_search.yaml puts it after "Task: Run the search command with the text: ")."""
    question = task_line(first_user).rsplit(": ", 1)[-1].strip()
    for pattern, kind, path in _QUESTIONS:
        if m := pattern.match(question):
            return m[1], kind, path, question
    return None


def read_facts(observation: str) -> dict[str, dict[str, str]]:
    """Entity name -> the attributes the passages in ``observation`` state about it."""
    facts: dict[str, dict[str, str]] = {}
    for passage in _PASSAGE.finditer(observation):
        for pattern in _FACTS:
            if m := pattern.match(passage["text"].strip()):
                found = m.groupdict()
                name = found.pop("name")
                if "river" in found:
                    found["river"] = "the " + found["river"]
                facts.setdefault(name, {}).update(found)
    return facts


class Step(NamedTuple):
    """The next action: a bash command, or None (a plain answer: nothing more it can do)."""

    command: str | None
    why: str


def next_step(messages: list[dict[str, Any]]) -> Step:
    """What to do at this point of a mini-swe-agent conversation, from the conversation alone."""
    users = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    question = parse_question(users[0]) if users else None
    if question is None:
        return Step(None, "I do not recognise this question.")
    subject, kind, path, asked = question
    commands = [
        found[-1].strip()
        for m in messages
        if m.get("role") == "assistant" and (found := _ACTION.findall(text_of(m.get("content"))))
    ]
    if any(c.endswith("> answer.txt") for c in commands):
        return Step(SUBMIT, "answered")
    facts: dict[str, dict[str, str]] = {}
    for observation in users[1:]:
        for name, attrs in read_facts(observation).items():
            facts.setdefault(name, {}).update(attrs)
    entity = subject
    for hop, attribute in enumerate(path):
        value = facts.get(entity, {}).get(attribute)
        if value is None:  # not read yet: search for it
            # a one-hop question is searched as it was asked, as the prompt's examples teach
            ask = asked if len(path) == 1 else _ASK[(kind, attribute)].format(s=entity)
            tried = {m[1] for c in commands if (m := _SEARCH.match(c))}
            for query in (ask, entity):
                if query not in tried:
                    return Step(f"search {quote(query)}", f"hop {hop + 1}: the {attribute} of {entity}")
            return Step(None, f"I could not find the {attribute} of {entity}.")
        entity, kind = value, _LINK_KIND.get(attribute, kind)
    return Step(f"echo {quote(entity)} > answer.txt", "the answer")


def quote(text: str) -> str:
    """Double quotes as the prompt's examples write them, unless the text needs shell escaping."""
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def answer(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message for this point of the conversation: one ```bash block, or plain text."""
    step = next_step(messages)
    if step.command is None:
        return {"role": "assistant", "content": step.why}
    return {"role": "assistant", "content": f"```bash\n{step.command}\n```"}


def create_app() -> Starlette:
    return create_server(answer, MODEL)


def main() -> None:
    serve(create_app(), "expert", __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
