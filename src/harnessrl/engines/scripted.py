"""A deterministic engine that replays scripted assistant turns, token by token (no torch).

Like mini-swe-agent's deterministic model: anyone can run a harness end to end through the real
gateway without a GPU or a model. Turn ``k`` of the script answers call ``k`` of a rollout. Each turn
is rendered in the model's own output format — what a ChatML+Hermes model would sample after
``<|im_start|>assistant\\n``::

    [<think>\\n{reasoning}\\n</think>\\n\\n]{content}
    <tool_call>
    {"name": ..., "arguments": {...}}
    </tool_call><|im_end|>

then tokenized with the real tokenizer and streamed with logprob 0.0, so the gateway's parsing,
streaming and token bookkeeping are exercised exactly as with a sampled reply.

Script file (JSON, or YAML when PyYAML is importable)::

    {"turns": [{"content": "...", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}, ...],
     "tokenizer": "optional model folder (relative to the script file)",
     "on_exhausted": "repeat_last" | "stop" | "error"}

or just the list of turns; a turn may also be a plain string (content only).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harnessrl.engines.base import GenerationContext, Samples, SamplingParams, WeightUpdate
from harnessrl.errors import ConfigError, ContextLengthExceeded, UpstreamError
from harnessrl.tokenizer import PolicyTokenizer

_ON_EXHAUSTED = ("repeat_last", "stop", "error")


def _load_script(
    source: str | Path | Sequence[Any] | Mapping[str, Any],
) -> tuple[dict[str, Any], Path | None]:
    """The script as a dict, and the folder relative paths in it are resolved against."""
    if isinstance(source, Mapping):
        return dict(source), None
    if isinstance(source, Sequence) and not isinstance(source, str):
        return {"turns": list(source)}, None
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"script file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"script {str(path)!r} is not UTF-8 text: {exc}") from exc
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise ConfigError(f"script {str(path)!r} is YAML but PyYAML is not installed") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"script {str(path)!r} is not valid YAML: {exc}") from exc
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"script {str(path)!r} is not valid JSON: {exc}") from exc
    if isinstance(data, list):
        data = {"turns": data}
    if not isinstance(data, dict):
        raise ConfigError(f"script {str(path)!r} must be a list of turns or an object with 'turns'")
    return data, path.parent


def _normalize_turn(turn: Any, index: int) -> dict[str, Any]:
    if isinstance(turn, str):
        return {"content": turn, "tool_calls": []}
    if not isinstance(turn, Mapping):
        raise ConfigError(f"script turn {index} must be a string or an object, got {turn!r}")
    unknown = set(turn) - {"content", "tool_calls", "reasoning"}
    if unknown:
        raise ConfigError(f"script turn {index} has unknown keys {sorted(unknown)}")
    # Checked here, at load: a turn that cannot be rendered would otherwise fail its call.
    for key in ("content", "reasoning"):
        if turn.get(key) is not None and not isinstance(turn[key], str):
            raise ConfigError(f"script turn {index}: {key!r} must be a string, got {turn[key]!r}")
    raw_calls = turn.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ConfigError(f"script turn {index}: 'tool_calls' must be a list, got {raw_calls!r}")
    calls = []
    for call in raw_calls:
        if not isinstance(call, Mapping) or "name" not in call:
            raise ConfigError(f"script turn {index}: each tool call needs a 'name', got {call!r}")
        arguments = call.get("arguments", {})
        try:
            # A string is written as it is (OpenAI's JSON text of the arguments): it must be JSON too,
            # or the rendered call is not one (`"arguments": ls -la`) and no tool call is parsed.
            json.loads(arguments) if isinstance(arguments, str) else json.dumps(arguments)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"script turn {index}: the arguments of tool call {call['name']!r} are not JSON: {exc}"
            ) from exc
        calls.append({"name": str(call["name"]), "arguments": arguments})
    return {"content": turn.get("content") or "", "tool_calls": calls, "reasoning": turn.get("reasoning")}


def render_turn(turn: Mapping[str, Any], end_of_turn: str = "<|im_end|>") -> str:
    """A scripted turn as the text the model would sample (it matches the chat template's rendering)."""
    parts = []
    if turn.get("content"):
        parts.append(turn["content"])
    for call in turn.get("tool_calls") or []:
        args = call.get("arguments", {})
        # The template writes a string `arguments` verbatim (OpenAI style) and a dict as JSON.
        args_json = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        parts.append(f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {args_json}}}\n</tool_call>')
    text = "\n".join(parts)
    if turn.get("reasoning"):
        text = f"<think>\n{turn['reasoning']}\n</think>\n\n" + text
    return text + end_of_turn


class ScriptedEngine:
    """Replays scripted turns; implements :class:`harnessrl.engines.base.Engine` without torch."""

    def __init__(
        self,
        script_path_or_turns: str | Path | Sequence[Any] | Mapping[str, Any],
        tokenizer: PolicyTokenizer | None = None,
        *,
        cache_dir: str | Path | None = None,
        context_length: int | None = None,
        token_delay_s: float = 0.0,
    ):
        data, base_dir = _load_script(script_path_or_turns)
        unknown = set(data) - {"turns", "tokenizer", "on_exhausted"}
        if unknown:
            raise ConfigError(f"script has unknown keys {sorted(unknown)}")
        raw_turns = data.get("turns")
        if not isinstance(raw_turns, list) or not raw_turns:
            raise ConfigError("a script needs a non-empty list of turns")
        self._turns = [_normalize_turn(t, i) for i, t in enumerate(raw_turns)]
        self._on_exhausted = data.get("on_exhausted", "repeat_last")
        if self._on_exhausted not in _ON_EXHAUSTED:
            raise ConfigError(f"on_exhausted must be one of {_ON_EXHAUSTED}, got {self._on_exhausted!r}")
        if tokenizer is None:
            tok_dir = data.get("tokenizer")
            if tok_dir is not None:
                tok_path = Path(tok_dir)
                if not tok_path.is_absolute() and base_dir is not None:
                    tok_path = base_dir / tok_path
            else:
                from harnessrl.engines.tiny import tiny_model_dir

                tok_path = tiny_model_dir(cache_dir, weights=False)
            tokenizer = PolicyTokenizer.from_dir(tok_path)
        self._tokenizer = tokenizer
        self._context_length = context_length or tokenizer.max_position_embeddings or 32768
        self._token_delay_s = token_delay_s
        self._version = 0
        self._counters: dict[str | None, int] = {}
        self._end = "<|im_end|>" if tokenizer.token_to_id("<|im_end|>") is not None else tokenizer.eos_token
        if self._end is None:
            raise ConfigError(f"tokenizer {tokenizer.name_or_path!r} has neither <|im_end|> nor an EOS token")
        self._started = False

    # --- Engine properties ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return "scripted"

    @property
    def tokenizer(self) -> PolicyTokenizer:
        return self._tokenizer

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def shares_weights(self) -> bool:
        return True  # stands in for a shared remote engine in tests

    @property
    def turns(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self._turns]

    async def start(self) -> None:
        self._started = True

    async def aclose(self) -> None:
        self._started = False

    # --- generation ----------------------------------------------------------------------------------

    def turn_for_call(self, call_index: int) -> dict[str, Any]:
        """The script turn that answers call ``call_index`` of a rollout (``on_exhausted`` applied)."""
        if call_index < len(self._turns):
            return self._turns[call_index]
        if self._on_exhausted == "repeat_last":
            return self._turns[-1]
        if self._on_exhausted == "stop":
            return {"content": "", "tool_calls": []}
        raise UpstreamError(f"the script has {len(self._turns)} turns; call {call_index} asked for another")

    def turn_token_ids(self, call_index: int) -> list[int]:
        """The full token IDs of the reply to call ``call_index`` (before max_tokens/stop truncation)."""
        return self._tokenizer.encode(render_turn(self.turn_for_call(call_index), self._end))

    def _call_index(self, context: GenerationContext | None) -> int:
        # A rollout's call_index comes from the gateway; anonymous callers get the engine's own counter.
        if context is not None and context.rollout_id is not None:
            return context.call_index
        key = None if context is None else context.rollout_id
        index = self._counters.get(key, 0)
        self._counters[key] = index + 1
        return index

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, context: GenerationContext | None = None
    ) -> AsyncIterator[Samples]:
        if len(prompt_ids) >= self._context_length:
            raise ContextLengthExceeded(
                f"prompt has {len(prompt_ids)} tokens; the context length is {self._context_length}",
                param="messages",
            )
        ids = self.turn_token_ids(self._call_index(context))
        budget = min(params.max_tokens, self._context_length - len(prompt_ids))
        stops = set(params.stop_token_ids)
        for token_id in ids[:budget]:
            if self._token_delay_s:
                await asyncio.sleep(self._token_delay_s)
            else:
                await asyncio.sleep(0)  # let other streams interleave, as a real engine would
            yield Samples([token_id], [0.0])  # one token at a time, as a decode step would
            if token_id in stops:
                return

    async def update_weights(self, update: WeightUpdate) -> None:
        self._version = update.version

    async def release_weights(self) -> bool:
        return False  # no weights: scripted answers

    def adopt_policy_version(self, version: int) -> None:
        """Scripted replies stand in for a shared remote engine in tests: only the label changes."""
        self._version = version

    async def health(self) -> dict[str, Any]:
        return {"engine": "scripted", "turns": len(self._turns), "policy_version": self._version}
