"""The search agent's teacher: the scripted expert (``examples/search_agent/expert.py``) and its
rollouts through the real mini-swe-agent in the sandbox, recorded by the gateway's teacher mode.

The expert reads only the conversation: the question in mini_search.yaml's prompt and the passages
the ``search`` command printed. On a recorded-shape conversation it searches the question, then writes
the passage's answer to answer.txt, then submits; on a multi-hop question each later search names the
entity the last passage named (a passage naming another entity changes the next search: the control).
With the real retriever and mini_search.yaml's own observation template it answers every question of
the data right within one step per hop plus one. Through ``harnessrl data calibrate`` with
``teacher.toml`` — the way ``benchmarks/distill_learning.py --example search_agent`` records a teacher
— it earns reward 1 through the real mini-swe-agent, one-hop and three-hop, and the store holds its
commands as the rollouts' calls. ``examples/search_agent/README.md``, "Distill, then RL".
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from jinja2 import StrictUndefined, Template
from tests.examples.example_files import HARNESSRL, load_script, records
from tests.examples.test_shell_agent import needs_sandbox

from harnessrl.retrieval.sandbox_tools.search_client import format_passages
from harnessrl.tasks.search import exact_match

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "search_agent"
EXPERT = load_script(EXAMPLE, "expert")
MINI = yaml.safe_load((EXAMPLE / "mini_search.yaml").read_text())


def prompt(question: str) -> list[dict]:
    """The first two messages mini-swe-agent sends with mini_search.yaml."""
    agent = MINI["agent"]
    return [
        {"role": "system", "content": agent["system_template"]},
        {"role": "user", "content": Template(agent["instance_template"]).render(task=question)},
    ]


def observation(output: str) -> dict:
    """An observation message as mini_search.yaml's template renders a command's output."""
    template = Template(MINI["model"]["observation_template"], undefined=StrictUndefined)
    return {"role": "user", "content": template.render(output={"output": output})}


def command(message: dict) -> str:
    """The action mini-swe-agent runs, parsed with mini_search.yaml's own action regex."""
    actions = re.findall(MINI["model"]["action_regex"], message["content"], re.DOTALL)
    assert len(actions) == 1, message
    return actions[0].strip()


def test_the_expert_searches_the_question_then_writes_the_passages_answer_then_submits():
    messages = prompt("In what year was Grondgeix founded?")
    first = EXPERT.answer(messages)
    assert first == {
        "role": "assistant",
        "content": '```bash\nsearch "In what year was Grondgeix founded?"\n```',
    }
    # What the search printed in the recorded rollout (the observation glues the Task line to it).
    found = (
        "[1] Grondgeix\nGrondgeix is a city in Gaessyxland. It was founded in 1733 by Bansein Haestrel. "
        "The river Thabro flows through Grondgeix.\n\n[2] Querkvrin Yianbraev\nQuerkvrin Yianbraev is a "
        "surveyor. Querkvrin Yianbraev was born in 1728 in Grondgeix."
    )
    messages += [first, observation(found)]
    second = EXPERT.answer(messages)
    assert command(second) == 'echo "1733" > answer.txt'
    messages += [second, observation("")]
    assert command(EXPERT.answer(messages)) == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    # The answer comes from the passage, not from anywhere else: another year there, another answer.
    messages[3] = observation(found.replace("in 1733 by", "in 1802 by"))
    assert command(EXPERT.answer(messages[:4])) == 'echo "1802" > answer.txt'


def test_a_multi_hop_question_searches_the_entity_each_passage_names():
    messages = prompt("In which country was the founder of Tryvniam Society born?")
    searches = []
    passages = [
        "[1] Tryvniam Society\nTryvniam Society is an organization in banking. It was founded in 1861 by "
        "Groundvrourk Lyskbyl and is headquartered in Siatoux.\n",
        "[1] Groundvrourk Lyskbyl\nGroundvrourk Lyskbyl is a mason. Groundvrourk Lyskbyl was born in 1790 "
        "in Siatoux.\n",
        "[1] Siatoux\nSiatoux is a city in Thouvyaenmark. It was founded in 1400 by Groundvrourk Lyskbyl. "
        "The river Vrel flows through Siatoux.\n",
    ]
    for output in passages:
        reply = EXPERT.answer(messages)
        searches.append(command(reply))
        messages += [reply, observation(output)]
    assert searches == [
        'search "Who founded Tryvniam Society?"',
        'search "In which city was Groundvrourk Lyskbyl born?"',
        'search "In which country is the city of Siatoux?"',
    ]
    assert command(EXPERT.answer(messages)) == 'echo "Thouvyaenmark" > answer.txt'
    # Control: a first passage naming another founder sends the second search after that one.
    other = prompt("In which country was the founder of Tryvniam Society born?")
    first = EXPERT.answer(other)
    other += [first, observation(passages[0].replace("Groundvrourk Lyskbyl", "Nalo Pirth"))]
    assert command(EXPERT.answer(other)) == 'search "In which city was Nalo Pirth born?"'
    # A passage that is not about the entity asked for: one more search, by its name alone.
    missed = prompt("In what year was Grondgeix founded?")
    first = EXPERT.answer(missed)
    missed += [first, observation("[1] Somewhere\nSomewhere is a city in X. It was founded in 1 by Y Z.\n")]
    assert command(EXPERT.answer(missed)) == 'search "Grondgeix"'


def test_a_prompt_it_does_not_know_gets_a_plain_answer_and_no_action():
    reply = EXPERT.answer(prompt("Write a haiku about rivers."))
    assert reply["content"] and "```" not in reply["content"]
    assert "```" not in EXPERT.answer([{"role": "user", "content": "hello"}])["content"]


def test_the_expert_answers_every_question_with_the_real_retriever(tmp_path: Path):
    """Every held-out question (1-3 hops) and 300 training ones, through the real index at
    ``top_k = 2`` and mini_search.yaml's observation template: right, in one step per hop plus one."""
    from harnessrl.retrieval.index import RetrievalIndex

    index = RetrievalIndex.for_corpus(EXAMPLE / "data" / "corpus.jsonl", tmp_path / "cache")
    tasks = records(EXAMPLE / "data" / "heldout.jsonl") + records(EXAMPLE / "data" / "train.jsonl")[:300]
    for task in tasks:
        messages = prompt(task["prompt"])
        for _ in range(task["hops"] + 1):
            reply = EXPERT.answer(messages)
            action = command(reply)
            if not action.startswith("search "):
                break
            hits = index.search(json.loads(action[len("search ") :]), 2)
            output = format_passages([{"title": h.title, "text": h.text} for h in hits]) + "\n"
            messages += [reply, observation(output)]
        written = re.fullmatch(r'echo "(.+)" > answer.txt', action)
        assert written and exact_match(written[1], task["hidden"]["answers"]), (task, messages[2:])


def test_the_expert_server_answers_whole_and_streamed_with_the_same_text():
    from openai import OpenAI

    from harnessrl.gateway.server import serve_in_thread

    messages = prompt("Who founded Muvte Mills?")
    with serve_in_thread(EXPERT.create_app()) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [EXPERT.MODEL]
        whole = client.chat.completions.create(model="m", messages=messages)
        assert whole.choices[0].finish_reason == "stop"
        stream = client.chat.completions.create(model="m", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content == '```bash\nsearch "Who founded Muvte Mills?"\n```'


def test_the_benchmark_hands_calibrate_the_search_tasks_unchanged():
    from harnessrl.data.records import to_task

    bench = load_script(ROOT / "benchmarks", "distill_learning")
    example = bench.EXAMPLES["search_agent"]
    tasks = records(example.folder / example.heldout_tasks)
    for task, record in zip(tasks, bench.records(tasks, example.group_by), strict=True):
        seen = to_task(record)
        assert (seen["task_id"], seen["prompt"], seen["hidden"]["answers"], seen["hops"]) == (
            task["task_id"],
            task["prompt"],
            task["hidden"]["answers"],
            task["hops"],
        )


def teacher_rollouts(tmp_path: Path, tasks: list[dict], *sets: str) -> list[tuple]:
    """``harnessrl data calibrate --k 1`` over ``tasks`` with teacher.toml, the expert served here;
    each task with its rollout and the rollout's recorded calls."""
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.store.sqlite import SQLiteStore

    bench = load_script(ROOT / "benchmarks", "distill_learning")
    given = tmp_path / "tasks.jsonl"
    given.write_text("".join(json.dumps(r) + "\n" for r in bench.records(tasks, "hops")))
    out, run_dir = tmp_path / "out.jsonl", tmp_path / "run"
    with serve_in_thread(EXPERT.create_app()) as url:
        argv = [*HARNESSRL, "data", "calibrate", str(given), str(out), "--k", "1", "--run-dir", str(run_dir)]
        argv += ["--config", str(EXAMPLE / "teacher.toml"), "--set", f"engine.teacher.base_url={url}/v1"]
        for item in sets:
            argv += ["--set", item]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = SQLiteStore(run_dir / "harnessrl.db")
    by_task = {r.task_id: r for r in store.list_rollouts()}
    found = [(by_task[t["task_id"]], store.list_calls(by_task[t["task_id"]].rollout_id)) for t in tasks]
    store.close()
    return found


@needs_sandbox
def test_the_expert_solves_one_hop_questions_through_real_mini_swe_agent_in_teacher_mode(tmp_path: Path):
    tasks = records(EXAMPLE / "data" / "heldout_1hop.jsonl")[:2]
    for task, (rollout, calls) in zip(tasks, teacher_rollouts(tmp_path, tasks), strict=True):
        assert rollout.reward == 1.0 and rollout.flags == [], (task, rollout)
        assert [c.response["content"] for c in calls] == [
            f'```bash\nsearch "{task["prompt"]}"\n```',
            f'```bash\necho "{task["hidden"]["answers"][0]}" > answer.txt\n```',
        ]
        # the second call's prompt holds the passages the search printed inside the sandbox
        assert task["hidden"]["answers"][0] in calls[1].request["messages"][-1]["content"]
        assert not calls[0].response_token_ids  # the teacher's tokens are not the student's


@needs_sandbox
def test_the_expert_solves_a_three_hop_question_through_real_mini_swe_agent(tmp_path: Path):
    task = next(t for t in records(EXAMPLE / "data" / "heldout.jsonl") if t["hops"] == 3)
    args = '["-c", "./mini_search.yaml", "-c", "agent.step_limit=5"]'
    [(rollout, calls)] = teacher_rollouts(tmp_path, [task], f"harness.args={args}")
    assert rollout.reward == 1.0, rollout
    actions = [command(c.response) for c in calls]
    assert [a.split(" ")[0] for a in actions] == ["search", "search", "search", "echo", "echo"]
    assert actions[-1] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
