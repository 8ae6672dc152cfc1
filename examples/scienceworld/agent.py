"""A ScienceWorld agent: an ordinary OpenAI-SDK script that plays one episode with text actions.

It knows nothing about harnessrl. It talks to whatever ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` point
at, takes its task from ``HARNESSRL_TASK`` (JSON: ``task_name``, ``variation``, ``simplifications``,
``max_steps``) or from the command line, and plays: the model answers each observation with one
action, the agent sends it to the environment and feeds the observation back (including
"No known action matches that input." for invalid actions), until the task ends or ``max_steps``
model turns are used.

After every step it writes the actions it sent to ``scienceworld_actions.json`` in its working
directory. That log is all the evaluator reads: it replays the actions in a fresh environment and
takes the score from the simulator, so nothing this script prints or claims can change the reward.

    python agent.py --task-name find-non-living-thing --variation 0 --max-steps 8
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from openai import OpenAI

LOG = "scienceworld_actions.json"
MAX_OBSERVATION_CHARS = 600  # small models have small contexts; a room description can be 1,500+ chars

SYSTEM = (
    "You play ScienceWorld, a text game. Each turn, reply with exactly one action and nothing else.\n"
    "Actions: look around | open OBJ | go to PLACE | pick up OBJ | focus on OBJ | move OBJ to OBJ | "
    "look at OBJ | activate OBJ | use OBJ on OBJ | wait{extra}\n"
    "Only focus on the object the task asks for: focusing on a wrong one fails the task."
)
# One worked exchange: small models answer the first observation with prose unless shown the format.
EXAMPLE = [
    {
        "role": "user",
        "content": "Example task: find a cup. This room is called the kitchen. You see a cup and a table.",
    },
    {"role": "assistant", "content": "pick up cup"},
    {"role": "user", "content": "You move the cup to the inventory. Now the real task."},
]
ASK = "\nYour action:"
THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
PREFIX = re.compile(r"^(?:action\s*:|>|-|\*|\d+\.\s)\s*", re.I)


def parse_action(reply: str) -> str:
    """The action in a model reply: its first non-empty line, without decoration, lower-cased.

    Every transformation keeps the action a substring of the (case- and space-normalized) reply,
    which is what the evaluator checks the log against.
    """
    text = THINK.sub("", reply or "")
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = PREFIX.sub("", line).strip().strip("`'\"").strip()
    line = line.rstrip(".").strip()
    return " ".join(line.split()).lower()[:100]


def shorten(observation: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    observation = observation.strip()
    return observation if len(observation) <= limit else observation[: limit - 3].rstrip() + "..."


def write_log(path: Path, task: dict, actions: list[str], score: int, done: bool) -> None:
    """Atomically: a harness killed at its deadline still leaves a readable log of what it did."""
    tmp = path.with_name("." + path.name + ".tmp")
    record = {"task_name": task["task_name"], "variation": task["variation"], "actions": actions}
    tmp.write_text(json.dumps({**record, "score": score, "done": done}))
    os.replace(tmp, path)


def step(env, action: str) -> tuple[str, int, bool]:
    """One action. ``env.server`` directly: ``env.step`` also lists every valid action-object
    combination after each step (~1 s of CPU), which this agent does not use."""
    observation = env.server.step(action)
    score = int(round(100 * env.server.getScore()))
    return observation, score, bool(env.server.getCompleted()) or score < 0


def read_task(args: argparse.Namespace) -> dict:
    task = json.loads(os.environ.get("HARNESSRL_TASK") or "{}")
    if args.task_name is not None:
        task["task_name"] = args.task_name
    if args.variation is not None:
        task["variation"] = args.variation
    if args.simplifications is not None:
        task["simplifications"] = args.simplifications
    if args.max_steps is not None:
        task["max_steps"] = args.max_steps
    if "task_name" not in task or "variation" not in task:
        sys.exit("agent.py: no task (set HARNESSRL_TASK or pass --task-name and --variation)")
    task.setdefault("simplifications", "")
    task.setdefault("max_steps", 10)
    return task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task-name")
    parser.add_argument("--variation", type=int)
    parser.add_argument("--simplifications")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--model", default=os.environ.get("HARNESSRL_MODEL", "policy"))
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--log", default=LOG)
    args = parser.parse_args()
    task = read_task(args)
    log = Path(args.log)

    from scienceworld import ScienceWorldEnv  # starts a JVM: a few seconds

    env = ScienceWorldEnv("")
    env.load(task["task_name"], int(task["variation"]), task["simplifications"])
    observation, info = env.reset()
    actions: list[str] = []
    score, done = int(info.get("score", 0)), False  # the start can already score (open doors)
    write_log(log, task, actions, score, done)

    extra = " | teleport to PLACE" if "teleport" in " ".join(env.get_possible_actions()) else ""
    messages = [
        {"role": "system", "content": SYSTEM.format(extra=extra)},
        *EXAMPLE,
        {"role": "user", "content": f"{env.get_task_description().strip()}\n\n{shorten(observation)}{ASK}"},
    ]
    client = OpenAI(max_retries=2, timeout=600)
    for turn in range(int(task["max_steps"])):
        reply = client.chat.completions.create(
            model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=args.temperature
        )
        content = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": content})
        action = parse_action(content)
        if not action:
            feedback = "Reply with one action, for example: look around"
        else:
            observation, score, done = step(env, action)
            actions.append(action)
            write_log(log, task, actions, score, done)
            feedback = f"{shorten(observation)}\n(score {score}, step {turn + 1}/{task['max_steps']}){ASK}"
        if done:
            break
        messages.append({"role": "user", "content": feedback})
    print(json.dumps({"actions": len(actions), "score": score, "done": done}))
    env.close()


if __name__ == "__main__":
    main()
