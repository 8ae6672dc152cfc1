"""The assistant example's teacher: the scripted expert (``examples/assistant/expert.py``) and its
rollouts through the real Hermes Agent in the sandbox, recorded by the gateway's teacher mode.

The expert reads only the prompt it is sent and solves every task of both splits (check.py scores
what it writes 1.0); a wrong answer is the control. Served on 127.0.0.1, whole and streamed answers
carry the same tool calls. Through ``harnessrl data calibrate`` with ``teacher.toml`` — the way
``benchmarks/distill_learning.py`` records a teacher — every task family earns 1.0 through Hermes,
and the store holds the expert's own tool calls and final answer as each rollout's calls; the wrong
expert scores below 1 on every family. ``examples/assistant/README.md``, "Distill, then RL".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.examples.example_files import HARNESSRL, load_script, records
from tests.examples.test_assistant import needs_hermes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "assistant"
EXPERT = load_script(EXAMPLE, "expert")


def write_calls(workspace: Path, message: dict) -> None:
    """Apply an answer's write_file calls to ``workspace``, as Hermes's tool does."""
    for call in message["tool_calls"]:
        assert call["function"]["name"] == "write_file"
        arguments = json.loads(call["function"]["arguments"])
        path = workspace / arguments["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(arguments["content"])


def wrong(prompt: str) -> dict[str, str] | None:
    """The control: the expert's files with a stray first line (a wrong heading, line count, word...)."""
    files = EXPERT.files_for(prompt)
    return {path: "wrong\n" + content for path, content in files.items()} if files else None


def test_the_expert_solves_every_task_from_its_prompt_alone_and_a_wrong_answer_does_not(tmp_path: Path):
    expert, score = EXPERT, load_script(EXAMPLE, "check").score
    tasks = records(EXAMPLE / "tasks" / "train.jsonl") + records(EXAMPLE / "tasks" / "heldout.jsonl")
    for i, task in enumerate(tasks):
        user = {"role": "user", "content": task["prompt"]}  # the prompt only: hidden.checks never sent
        first = expert.answer([{"role": "system", "content": "You are Hermes."}, user])
        assert first["content"] is None and first["tool_calls"], task
        write_calls(tmp_path / f"ws{i}", first)
        assert score(task["hidden"]["checks"], tmp_path / f"ws{i}") == (1.0, []), task
        write_calls(tmp_path / f"bad{i}", expert.answer([user], wrong))
        assert score(task["hidden"]["checks"], tmp_path / f"bad{i}")[0] < 1.0, task
        tool = {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "{}"}
        final = expert.answer([user, first, tool])
        assert final["content"].startswith("Done: wrote ") and "tool_calls" not in final
    folder = next(t for t in tasks if t["family"] == "folder_of_empty_files")
    assert len(expert.answer([{"role": "user", "content": folder["prompt"]}])["tool_calls"]) == 2
    # A prompt it does not know: a text answer, no tool call (the rollout earns nothing).
    unknown = expert.answer([{"role": "user", "content": "Write a haiku about rivers."}])
    assert "tool_calls" not in unknown and unknown["content"]


def test_the_expert_server_answers_whole_and_streamed_with_the_same_tool_calls():
    from openai import OpenAI

    from harnessrl.gateway.server import serve_in_thread

    expert = EXPERT
    prompt = "Create a folder named box containing two empty files, plan.txt and todo.txt."
    with serve_in_thread(expert.create_app()) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [expert.MODEL]
        messages = [{"role": "user", "content": prompt}]
        whole = client.chat.completions.create(model="m", messages=messages)
        assert whole.choices[0].finish_reason == "tool_calls"
        calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
        stream = client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        parts: dict[int, list[str]] = {}
        finish, usage = None, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    parts.setdefault(delta.index, ["", ""])
                    parts[delta.index][0] += delta.function.name or ""
                    parts[delta.index][1] += delta.function.arguments or ""
        assert [tuple(parts[i]) for i in sorted(parts)] == calls and finish == "tool_calls" and usage
        assert [json.loads(a) for _, a in calls] == [
            {"content": "", "path": "box/plan.txt"},
            {"content": "", "path": "box/todo.txt"},
        ]


def teacher_rollouts(tmp_path: Path, name: str, solve, tasks: list[dict]) -> list[tuple[dict, list]]:
    """``harnessrl data calibrate --k 1`` over ``tasks`` with teacher.toml, the expert (answering with
    ``solve``) served here; each task with its rollout's recorded calls."""
    from harnessrl.gateway.server import serve_in_thread
    from harnessrl.store.sqlite import SQLiteStore

    expert = EXPERT
    given = tmp_path / f"{name}-tasks.jsonl"
    given.write_text(
        "".join(
            json.dumps({"instance_id": t["task_id"], "problem_statement": t["prompt"], "hidden": t["hidden"]})
            + "\n"
            for t in tasks
        )
    )
    out, run_dir = tmp_path / f"{name}.jsonl", tmp_path / f"run-{name}"
    with serve_in_thread(expert.create_app(solve)) as url:
        argv = [*HARNESSRL, "data", "calibrate", str(given), str(out), "--k", "1", "--run-dir", str(run_dir)]
        argv += ["--config", str(EXAMPLE / "teacher.toml"), "--set", f"engine.teacher.base_url={url}/v1"]
        # teacher.toml's own engine.model (scripted:./unused_policy.json, beside it), from another folder
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = SQLiteStore(run_dir / "harnessrl.db")
    by_task = {r.task_id: r for r in store.list_rollouts()}
    found = [(by_task[t["task_id"]], store.list_calls(by_task[t["task_id"]].rollout_id)) for t in tasks]
    store.close()
    return found


@pytest.mark.slow
@needs_hermes
def test_the_expert_solves_every_family_through_real_hermes_in_teacher_mode(tmp_path: Path):
    expert = EXPERT
    heldout = records(EXAMPLE / "tasks" / "heldout.jsonl")
    tasks = [
        next(t for t in heldout if t["family"] == f.__name__)
        for f in load_script(EXAMPLE, "make_tasks").FAMILIES
    ]
    for task, (rollout, calls) in zip(
        tasks, teacher_rollouts(tmp_path, "expert", expert.files_for, tasks), strict=True
    ):
        assert rollout.reward == 1.0 and rollout.flags == [], (task["family"], rollout)
        # Recorded as the harness got them: Hermes streamed the expert's write_file calls, then its answer.
        assert [c.api for c in calls] == ["chat.completions"] * 2 and calls[0].request["stream"], task
        written = {
            json.loads(c["function"]["arguments"])["path"]: json.loads(c["function"]["arguments"])["content"]
            for c in calls[0].response["tool_calls"]
        }
        assert written == expert.files_for(task["prompt"]), task
        assert calls[1].response["content"].startswith("Done: wrote ") and not calls[1].response.get(
            "tool_calls"
        )
        assert not calls[0].response_token_ids  # the teacher's tokens are not the student's
    # Control: the same teacher mode with a wrong expert scores below 1 on every family.
    for task, (rollout, _) in zip(tasks, teacher_rollouts(tmp_path, "wrong", wrong, tasks), strict=True):
        assert rollout.reward is not None and rollout.reward < 1.0, (task["family"], rollout.reward)


def test_the_benchmark_hands_calibrate_the_example_tasks_unchanged():
    """``benchmarks/distill_learning.py`` records the teacher with ``data calibrate``: its records,
    read back by ``to_task``, are the example's tasks (same id, prompt and hidden checks)."""
    from harnessrl.data.records import to_task

    bench = load_script(ROOT / "benchmarks", "distill_learning")
    tasks = records(EXAMPLE / "tasks" / "heldout.jsonl")
    for task, record in zip(tasks, bench.records(tasks), strict=True):
        seen = to_task(record)
        assert (seen["task_id"], seen["prompt"], seen["hidden"]["checks"]) == (
            task["task_id"],
            task["prompt"],
            task["hidden"]["checks"],
        )
