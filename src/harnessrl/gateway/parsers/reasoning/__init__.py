"""Reasoning parsers: sampled text -> reasoning and content, incrementally, per model family, in a registry.

Each family's parser is a module of this package (``think`` for the ``<think>`` families,
``harmony`` for gpt-oss), built on ``base``; ``get_reasoning_parser`` picks one by name (``[gateway]
reasoning_parser``) and ``split_reasoning`` is the non-streaming view.

A parser is fed the text as it is sampled and returns ``ReasoningText`` / ``ContentText`` pieces
(``finish`` releases what it held back), so streaming and non-streaming answers come from the same
code, and any split of the text into pieces gives the same result. It never raises. The content is
what the tool parser reads next, as in vLLM's server (reasoning first, then tools).

``starts_in_reasoning``: the prompt already opened the block (Qwen3-2507 and GLM-4.7 end the
generation prompt with ``<think>``); see ``prompt_opens_reasoning``.

Families (vLLM's ``--reasoning-parser`` names; semantics checked against vLLM's own parsers in
``tests/vllm/test_reasoning_differential.py``):

- ``qwen3``, ``kimi_k2``: reasoning is the block the prompt opened, or a ``<think>`` block the answer
  starts with (after whitespace). Inside it a repeated ``<think>`` is dropped; ``</think>`` ends it,
  and so does the start of a tool call (``<tool_call>``; Kimi's ``<|tool_calls_section_begin|>``),
  which then belongs to the content. After the block a stray ``</think>`` is dropped; a later
  ``<think>`` is ordinary content. A tool call's block in the content (``<tool_call>`` to
  ``</tool_call>``; Kimi's section) is passed on verbatim: markers in a call's arguments are the
  arguments' text, as in chat completions, where the tool parser reads the sampled text whole.
- ``glm45`` (``glm47``): the same, but a ``<think>`` anywhere in the content (outside a tool call's
  block) opens another block.
- ``deepseek_r1``: everything up to ``</think>`` is reasoning, with or without an opening tag (the
  model always thinks); its first ``<think>`` is dropped; the rest of the text is content verbatim.
- ``deepseek_v3`` (V3.1+, hybrid): R1's grammar when the prompt opened the block (or the answer starts
  with ``<think>``); otherwise the text is content.
- ``openai_gptoss``: Harmony channels. ``analysis`` messages are reasoning; ``final`` (and
  ``commentary`` without a recipient, a preamble) are content; messages to a tool pass through
  verbatim for the ``harmony`` tool parser. Several messages of one kind are joined with ``\\n``.

Where we depart from vLLM, on purpose:

- vLLM's engine parsers (qwen3, glm45, kimi_k2) cannot see the prompt and assume thinking is on, so
  an answer with no tags at all is reasoning there; ours is content unless the prompt opened the
  block (vLLM with ``enable_thinking: false`` agrees). An unclosed block stays reasoning in both.
- Whitespace is kept as sampled (vLLM strips the end of the reasoning for some families); callers trim.
- deepseek_r1: vLLM's non-streaming path cuts the text at its first ``<think>`` wherever it is, so
  text before it is lost (all of a finished block and answer, when the ``<think>`` comes in the
  answer); we keep it, as vLLM's streaming path does.
- A ``<think>`` later in the content after an unopened start (glm45 only, which opens a block there)
  is read by the grammar; vLLM with thinking off reads nothing.
- openai_gptoss: text between messages (after ``<|end|>``, before ``<|start|>``) is kept as content
  (vLLM drops it); messages to built-in tools pass through as text (vLLM drops them).
"""

from __future__ import annotations

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.reasoning.base import (
    ContentText,
    ReasoningEvent,
    ReasoningParser,
    ReasoningParserFactory,
    ReasoningText,
)
from harnessrl.gateway.parsers.reasoning.harmony import GptOssReasoningParser
from harnessrl.gateway.parsers.reasoning.think import (
    DeepSeekR1ReasoningParser,
    DeepSeekV3ReasoningParser,
    Glm45ReasoningParser,
    KimiK2ReasoningParser,
    Qwen3ReasoningParser,
    ThinkReasoningParser,
)

__all__ = [
    "REASONING_PARSERS",
    "ContentText",
    "DeepSeekR1ReasoningParser",
    "DeepSeekV3ReasoningParser",
    "Glm45ReasoningParser",
    "GptOssReasoningParser",
    "KimiK2ReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningEvent",
    "ReasoningParser",
    "ReasoningParserFactory",
    "ReasoningText",
    "ThinkReasoningParser",
    "get_reasoning_parser",
    "split_reasoning",
]

REASONING_PARSERS: dict[str, ReasoningParserFactory] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "deepseek_v3": DeepSeekV3ReasoningParser,
    "glm45": Glm45ReasoningParser,
    "glm47": Glm45ReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
}


def get_reasoning_parser(name: str) -> ReasoningParserFactory:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ConfigError(f"gateway.reasoning_parser: unknown parser {name!r} (known: {known})") from None


def split_reasoning(
    text: str, parser: str = "qwen3", *, starts_in_reasoning: bool = False
) -> tuple[str | None, str]:
    """The non-streaming view: ``(reasoning or None, content)``."""
    p = get_reasoning_parser(parser)(starts_in_reasoning=starts_in_reasoning)
    events = p.feed(text) + p.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningText))
    content = "".join(e.text for e in events if isinstance(e, ContentText))
    return (reasoning if any(isinstance(e, ReasoningText) for e in events) else None), content
