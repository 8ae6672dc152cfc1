"""The scripted engine: replies in the model's own format, token by token, without torch."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harnessrl.config import EngineConfig
from harnessrl.engines.base import Engine, GenerationContext, SamplingParams, WeightUpdate, each_sample
from harnessrl.engines.factory import create_engine
from harnessrl.engines.scripted import ScriptedEngine, render_turn
from harnessrl.errors import ConfigError, ContextLengthExceeded, UpstreamError
from harnessrl.tokenizer import PolicyTokenizer

TURNS = [
    {"content": "I'll look around.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls -la"}}]},
    {
        "content": "",
        "tool_calls": [{"name": "bash", "arguments": {"command": "cat a.py"}}, {"name": "submit"}],
    },
    "All done ✅.",
]


def _collect(engine: ScriptedEngine, params: SamplingParams, context: GenerationContext | None = None):
    async def run():
        return [t async for t in each_sample(engine.generate([1, 2, 3], params, context))]

    return asyncio.run(run())


@pytest.fixture
def engine(tiny_dir: Path) -> ScriptedEngine:
    return ScriptedEngine(TURNS, PolicyTokenizer.from_dir(tiny_dir))


def test_stream_decodes_to_the_rendered_turn(engine: ScriptedEngine) -> None:
    assert isinstance(engine, Engine)
    for k in range(3):
        samples = _collect(engine, SamplingParams(max_tokens=1000), GenerationContext("r1", call_index=k))
        assert all(s.logprob == 0.0 for s in samples)
        text = engine.tokenizer.decode([s.token_id for s in samples])
        assert text == render_turn(engine.turn_for_call(k))
        assert text.endswith("<|im_end|>")


def test_turn_matches_the_chat_templates_assistant_message(engine: ScriptedEngine) -> None:
    tok = engine.tokenizer
    turn = engine.turn_for_call(0)
    message = {
        "role": "assistant",
        "content": turn["content"],
        "tool_calls": [{"type": "function", "function": c} for c in turn["tool_calls"]],
    }
    prompt = tok.render_chat([{"role": "user", "content": "hi"}])
    full = tok.render_chat([{"role": "user", "content": "hi"}, message], add_generation_prompt=False)
    # What the model samples after the generation prompt is exactly the template's assistant turn.
    assert full == prompt + render_turn(turn) + "\n"


def test_max_tokens_and_stop_tokens(engine: ScriptedEngine) -> None:
    ctx = GenerationContext("r1", call_index=0)
    assert len(_collect(engine, SamplingParams(max_tokens=3), ctx)) == 3
    full = [s.token_id for s in _collect(engine, SamplingParams(max_tokens=1000), ctx)]
    stop = full[4]
    cut = _collect(engine, SamplingParams(max_tokens=1000, stop_token_ids=(stop,)), ctx)
    assert [s.token_id for s in cut] == full[: full.index(stop) + 1]


def test_anonymous_calls_use_a_counter_and_exhaustion_policies(tiny_dir: Path) -> None:
    tok = PolicyTokenizer.from_dir(tiny_dir)
    repeat = ScriptedEngine({"turns": ["a", "b"]}, tok)
    texts = [
        tok.decode([s.token_id for s in _collect(repeat, SamplingParams(max_tokens=50))]) for _ in range(3)
    ]
    assert texts == ["a<|im_end|>", "b<|im_end|>", "b<|im_end|>"]
    stop = ScriptedEngine({"turns": ["a"], "on_exhausted": "stop"}, tok)
    late = GenerationContext("r", call_index=5)
    assert (
        tok.decode([s.token_id for s in _collect(stop, SamplingParams(max_tokens=50), late)]) == "<|im_end|>"
    )
    error = ScriptedEngine({"turns": ["a"], "on_exhausted": "error"}, tok)
    with pytest.raises(UpstreamError):
        _collect(error, SamplingParams(max_tokens=50), late)


def test_script_files_json_and_yaml_and_factory(tmp_path: Path, tiny_dir: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"turns": TURNS, "tokenizer": str(tiny_dir)}))
    engine = create_engine(EngineConfig(model=f"scripted:{tmp_path / 's.json'}"))
    assert isinstance(engine, ScriptedEngine) and engine.turns[2]["content"] == "All done ✅."
    yaml = pytest.importorskip("yaml")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TURNS, allow_unicode=True))
    assert ScriptedEngine(tmp_path / "s.yaml", PolicyTokenizer.from_dir(tiny_dir)).turns == engine.turns
    with pytest.raises(ConfigError):
        ScriptedEngine([{"contents": "typo"}], PolicyTokenizer.from_dir(tiny_dir))


def test_context_length_and_weights(engine: ScriptedEngine) -> None:
    small = ScriptedEngine(TURNS, engine.tokenizer, context_length=3)
    with pytest.raises(ContextLengthExceeded):
        _collect(small, SamplingParams(max_tokens=5))
    asyncio.run(engine.update_weights(WeightUpdate(version=7)))
    assert engine.policy_version == 7
    assert asyncio.run(engine.health())["policy_version"] == 7


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("bad.yaml", b"turns: [a, b\n", "not valid YAML"),
        ("bad.json", b"\xff\xfe{}", "not UTF-8"),
        ("num.json", b'{"turns": [{"content": 5}]}', "'content' must be a string"),
        ("why.json", b'{"turns": [{"content": "x", "reasoning": ["a"]}]}', "'reasoning' must be a string"),
        ("calls.json", b'{"turns": [{"tool_calls": "ls"}]}', "'tool_calls' must be a list"),
        ("date.yaml", b"- tool_calls: [{name: f, arguments: {when: 2024-01-01}}]\n", "are not JSON"),
        # A string is written verbatim into the call: text that is not JSON would render no tool call.
        (
            "text.json",
            b'{"turns": [{"tool_calls": [{"name": "bash", "arguments": "ls -la"}]}]}',
            "are not JSON",
        ),
    ],
)
def test_a_script_file_that_cannot_be_read_or_rendered_is_a_config_error_at_load(
    tmp_path: Path, tiny_dir: Path, name: str, content: bytes, says: str
) -> None:
    # A clear ConfigError when the engine is made (the CLI's exit 2), not a parser's traceback, nor a
    # TypeError when a call reaches the bad turn.
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=says):
        ScriptedEngine(tmp_path / name, PolicyTokenizer.from_dir(tiny_dir))
    # Control: the same file, well formed, loads and renders.
    (tmp_path / "good.json").write_text(json.dumps({"turns": TURNS}))
    assert _collect(
        ScriptedEngine(tmp_path / "good.json", PolicyTokenizer.from_dir(tiny_dir)), SamplingParams(5)
    )
