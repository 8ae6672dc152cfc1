"""The assistant example: instruction following through an unmodified Hermes Agent, scored by check.py.

The task generator (deterministic, held-out disjoint from training), the scorer (every constraint
kind, partial credit, a symlink never passes for the file asked for), the configs (RLOO, the Hermes
preset with its file tools), a scripted policy through the real Hermes in the sandbox (the right file
earns 1, a half-right one part of it), and one training step on the tiny model through Hermes.
``examples/assistant/README.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.examples.example_files import HARNESSRL, load_script, make_tasks, records, scripted_rollout

from harnessrl.controller.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "assistant"

needs_hermes = pytest.mark.skipif(
    os.geteuid() != 0 or PRESETS["hermes"]().command[0] == "hermes",
    reason="the sandbox needs root here, and Hermes Agent in .harnesses/hermes-venv (./install.sh)",
)


def answers_hermes_rewrote(calls: list) -> list[int]:
    """Seqs of the calls whose answer Hermes sent back changed, beyond what the gateway matches.

    Hermes strips reasoning and tool-call markup from every assistant turn it keeps
    (``strip_think_blocks``: a stray ``<think>`` or ``</think>``, a ``<tool_call>…</tool_call>`` block
    left in the text), then sends that turn back. The gateway reuses a turn's sampled tokens only
    when the text after its reasoning is the same (``visible_text``), so a rewritten answer ends its
    chain: the next call's prompt no longer extends it. A random tiny model samples those tags now
    and then. Each call is compared with the assistant turn the next call sent back for it.
    """
    from harnessrl.gateway.prompt.messages import visible_text

    def text(message: dict) -> str:
        return visible_text(message.get("content") or "")

    rewritten = []
    ordered = sorted(calls, key=lambda c: c.seq)
    for answered, following in zip(ordered, ordered[1:], strict=False):
        sent_back = [m for m in following.request["messages"] if m.get("role") == "assistant"]
        if sent_back and text(sent_back[-1]) != text(answered.response):
            rewritten.append(answered.seq)
    return rewritten


def test_tasks_are_deterministic_disjoint_and_match_the_committed_files(tmp_path: Path):
    report = make_tasks(EXAMPLE, tmp_path / "a")
    make_tasks(EXAMPLE, tmp_path / "b")
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() == (EXAMPLE / "tasks" / name).read_bytes()
    train, heldout = records(tmp_path / "a" / "train.jsonl"), records(tmp_path / "a" / "heldout.jsonl")
    assert (len(train), len(heldout)) == (report["train"], report["heldout"]) == (300, 40)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    assert len({r["task_id"] for r in train + heldout}) == 340
    assert {r["family"] for r in heldout} == {f.__name__ for f in load_script(EXAMPLE, "make_tasks").FAMILIES}
    for record in train + heldout:
        assert record["hidden"]["checks"] and "checks" not in record["prompt"]
    make_tasks(EXAMPLE, tmp_path / "c", "--seed", "1")
    assert (tmp_path / "c" / "heldout.jsonl").read_bytes() != (tmp_path / "a" / "heldout.jsonl").read_bytes()
    with pytest.raises(SystemExit, match="shares 1 task"):
        load_script(EXAMPLE, "make_tasks").check_disjoint(train[:1], train[:1])


def test_the_scorer_gives_the_share_met_and_a_symlink_never_passes(tmp_path: Path):
    score = load_script(EXAMPLE, "check").score
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "list.md").write_text("# Shopping\n- apple\n- lemon\n")
    (ws / "up.txt").write_text("LEMON\n")
    (ws / "low.txt").write_text("lemon\n")
    (ws / "n.txt").write_text("7\n6\n5\n")
    (ws / "words.txt").write_text("tiger\nstone\n")
    (ws / "config.json").write_text('{"port": 42}')
    (ws / "bad.json").write_text('{"port": "42"}')
    (ws / "box").mkdir()
    (ws / "box" / "a.txt").write_text("")
    (ws / "box" / "b.txt").write_text("x")

    def share(*checks: dict) -> float:
        return score(list(checks), ws)[0]

    assert share({"kind": "first_line", "path": "list.md", "value": "# Shopping"}) == 1.0
    assert share({"kind": "bullets", "path": "list.md", "value": ["lemon", "apple"]}) == 1.0
    assert share({"kind": "bullets", "path": "list.md", "value": ["apple"]}) == 0.0
    assert share({"kind": "exact", "path": "up.txt", "value": "LEMON"}) == 1.0
    assert share({"kind": "exact", "path": "low.txt", "value": "LEMON"}) == 0.0
    assert share({"kind": "lines_exact", "path": "n.txt", "value": ["7", "6", "5"]}) == 1.0
    assert share({"kind": "lines_exact", "path": "n.txt", "value": ["5", "6", "7"]}) == 0.0
    assert share({"kind": "lines_from", "path": "words.txt", "value": ["tiger", "stone", "cloud"]}) == 1.0
    assert share({"kind": "lines_from", "path": "words.txt", "value": ["tiger", "cloud"]}) == 0.0
    assert share({"kind": "json_key", "path": "config.json", "key": "port", "value": 42}) == 1.0
    assert share({"kind": "json_key", "path": "bad.json", "key": "port", "value": 42}) == 0.0  # a string
    assert share({"kind": "dir", "path": "box"}, {"kind": "empty_file", "path": "box/a.txt"}) == 1.0
    # Partial credit: two of three constraints met.
    half = share(
        {"kind": "file", "path": "n.txt"},
        {"kind": "line_count", "path": "n.txt", "value": 3},
        {"kind": "empty_file", "path": "box/b.txt"},
    )
    assert half == pytest.approx(2 / 3)
    # Control: the same content as a real file passes; as a symlink, or under a symlinked folder, not.
    outside = tmp_path / "outside.txt"
    outside.write_text("LEMON\n")
    (ws / "link.txt").symlink_to(outside)
    (ws / "linkbox").symlink_to(ws / "box")
    assert share({"kind": "exact", "path": "link.txt", "value": "LEMON"}) == 0.0
    assert share({"kind": "dir", "path": "linkbox"}, {"kind": "empty_file", "path": "linkbox/a.txt"}) == 0.0
    with pytest.raises(ValueError, match="leaves the workspace"):
        score([{"kind": "file", "path": "../outside.txt"}], ws)


def test_configs_are_valid_rloo_and_run_hermes_with_its_file_tools():
    from harnessrl.cli.rollout import load_rollout_config
    from harnessrl.config import load_raw_config, resolve_relative_paths, validate_config
    from harnessrl.trainer.config import TrainConfig

    configs = {
        name: validate_config(TrainConfig, resolve_relative_paths(load_raw_config(EXAMPLE / name), EXAMPLE))
        for name in ("train.toml", "train_gpu.toml")
    }
    for name, config in configs.items():
        assert config.algorithm.advantage == "rloo" and config.harness.preset == "hermes", name
        assert config.evaluator.command == ["python3", str(EXAMPLE / "check.py")], name
        assert (EXAMPLE / config.tasks.path).is_file() and (EXAMPLE / config.heldout.path).is_file(), name
    assert configs["train.toml"].harness.args[:2] == ["-t", "file"]
    assert (
        configs["train_gpu.toml"].engine.device == "cuda"
        and "-t" not in configs["train_gpu.toml"].harness.args
    )
    rollout = load_rollout_config(str(EXAMPLE / "rollout.toml"), [])
    assert rollout.harness.args == configs["train.toml"].harness.args
    assert rollout.gateway.max_tokens == configs["train.toml"].trainer.max_tokens


@pytest.mark.slow
@needs_hermes
def test_scripted_policy_through_real_hermes_right_file_earns_1_half_right_part(tmp_path: Path):
    task = {
        "prompt": "Write the word lemon in uppercase letters into notes.txt, and nothing else.",
        "hidden": {
            "checks": [
                {"kind": "file", "path": "notes.txt"},
                {"kind": "exact", "path": "notes.txt", "value": "LEMON"},
            ]
        },
    }

    def write(content: str) -> list:
        call = {"name": "write_file", "arguments": {"path": "notes.txt", "content": content}}
        return [{"content": "Writing it.", "tool_calls": [call]}, "Done: notes.txt is written."]

    right = scripted_rollout(EXAMPLE, tmp_path, "right", write("LEMON\n"), task)
    assert right["reward"] == 1.0 and right["calls"] == 2 and right["flags"] == [], right
    assert (Path(right["log"]) / "workspace" / "notes.txt").read_text() == "LEMON\n"
    half = scripted_rollout(EXAMPLE, tmp_path, "half", write("lemon\n"), task)
    assert half["reward"] == 0.5, half  # the file exists; its content is not what was asked


@pytest.mark.slow
@needs_hermes
def test_hermes_rewriting_an_answer_it_sends_back_ends_the_sample_there(tmp_path: Path):
    """The one way a Hermes rollout is more than one sample: Hermes strips markup from an answer.

    Each scripted answer is cut at 8 tokens, so Hermes asks to continue 3 times (4 calls). With a
    stray ``<think>`` in it, Hermes sends every answer back without the tag: 3 rewrites, 4 samples.
    The control, an answer cut in a run of newlines that Hermes strips as whitespace, stays one sample
    (the gateway matches an answer up to surrounding whitespace).
    """
    from harnessrl.store.sqlite import SQLiteStore
    from harnessrl.trajectory.samples import build_rollout_samples

    task = {
        "prompt": "Write LEMON into notes.txt.",
        "hidden": {"checks": [{"kind": "file", "path": "notes.txt"}]},
    }
    answers = {
        "tag": "ok <think> abc def ghi jkl mno pqr stu vwx yz",
        "newlines": "abc def" + "\n" * 16,
    }
    found = {}
    for name, answer in answers.items():
        summary = scripted_rollout(EXAMPLE, tmp_path, name, [answer], task, "gateway.max_tokens=8")
        assert summary["calls"] == 4, summary
        store = SQLiteStore(summary["store"])
        [rollout] = store.list_rollouts()
        calls = store.list_calls(rollout.rollout_id)
        samples = build_rollout_samples(rollout, calls)
        found[name] = (answers_hermes_rewrote(calls), len(samples.samples), dict(samples.breaks))
        store.close()
    assert found["tag"] == ([0, 1, 2], 4, {"prefix_mismatch": 3})
    assert found["newlines"] == ([], 1, {})


@pytest.mark.slow
@needs_hermes
def test_one_training_step_on_the_tiny_model_through_hermes(tmp_path: Path):
    from harnessrl.store.sqlite import SQLiteStore

    overrides = {
        "run.dir": str(tmp_path / "run"),
        "engine.model": "tiny",  # 4096 positions: Hermes's file-tools prompt (~3.8k tokens) fits
        "trainer.mode": "sync",
        "trainer.steps": "1",
        "trainer.tasks_per_step": "2",
        "trainer.group_size": "2",
        "trainer.max_tokens": "16",
        "trainer.autocast": "none",
        "trainer.eval_every": "0",
        "metrics.progress": "false",
        "metrics.tensorboard": "false",
    }
    argv = [*HARNESSRL, "train", str(EXAMPLE / "train.toml")]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["steps"] == 1

    [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["rollouts/total"] == 4 and row["rollouts/infra_failures"] == 0
    assert row["policy_version"] == 1
    assert row["policy/loss_tokens"] > 0

    store = SQLiteStore(tmp_path / "run" / "harnessrl.db")
    rollouts = store.list_rollouts()
    assert len(rollouts) == 4
    rewritten = {}
    for rollout in rollouts:
        assert rollout.status.value == "finished" and rollout.metadata.get("trained_at_step") == 1
        assert rollout.metadata["evaluation"]["output"]["detail"]  # check.py ran on the workspace
        calls = store.list_calls(rollout.rollout_id)
        assert calls and all(len(c.response_token_ids) <= 16 for c in calls)  # trainer.max_tokens caps 65536
        rewritten[rollout.rollout_id] = answers_hermes_rewrote(calls)
    # Hermes appends to its history: however many calls a rollout made, it is one sample, unless
    # Hermes stripped a tag the tiny model sampled from an answer it sent back (a fresh-clone CI run
    # had 5 samples). Each such rewrite, and nothing else, ends a chain.
    rewrites = sum(len(seqs) for seqs in rewritten.values())
    breaks = {key: value for key, value in row.items() if key.startswith("trajectory/breaks/") and value}
    assert row["trajectory/samples"] == 4 + rewrites, (row["trajectory/samples"], rewritten, breaks)
    assert sum(breaks.values()) == rewrites, (rewritten, breaks)
    assert [v.version for v in store.list_policy_versions()] == [1]
    store.close()
