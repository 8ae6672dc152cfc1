"""Which tool-call and reasoning formats a model speaks, read from its chat template.

The gateway owns tokenization, so it must parse the model family's own formats: a Qwen3-Coder
model writes ``<function=NAME>`` XML, Llama 3 writes JSON after ``<|python_tag|>``, gpt-oss writes
harmony channels. The chat template renders tool calls of earlier turns in exactly the format the
model was trained to emit, so its markers say which parser reads the answers. ``[gateway]
tool_call_parser`` / ``reasoning_parser`` = ``"auto"`` (the default) choose by the first matching
rule below; a name chooses explicitly. A template without any known marker keeps the ``hermes``
parser and ``<think>`` reasoning: what the gateway did before it detected anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

AUTO = "auto"
DEFAULT_TOOL_PARSER = "hermes"
DEFAULT_REASONING_PARSER = "qwen3"


@dataclass(frozen=True)
class FormatRule:
    """A family: all of ``markers`` in the chat template → its tool and reasoning parsers."""

    family: str
    markers: tuple[str, ...]
    tool_parser: str
    reasoning_parser: str | None  # None: the family's default (``<think>``) is kept


# First match wins: more specific formats before ones whose markers they share (Qwen3-Coder's
# template also says ``<tool_call>``; DeepSeek V3, R1 and V3.1 share the section markers). Llama
# comes late: every Llama-3 vocabulary has <|python_tag|>, so only its template's use counts.
RULES: tuple[FormatRule, ...] = (
    FormatRule("gpt-oss (harmony)", ("<|channel|>", "<|message|>"), "openai", "openai_gptoss"),
    FormatRule("Qwen3-Coder / Qwen3.5 (XML)", ("<function=", "<parameter="), "qwen3_coder", "qwen3"),
    FormatRule("GLM-4.5+", ("<arg_key>", "<arg_value>"), "glm45", "glm45"),
    # DeepSeek V3 and R1 write arguments in a ```json fence after the name; V3.1+ does not.
    FormatRule(
        "DeepSeek R1",
        ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "```json", "</think>"),
        "deepseek_v3",
        "deepseek_r1",
    ),
    FormatRule("DeepSeek V3", ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "```json"), "deepseek_v3", None),
    FormatRule(
        "DeepSeek V3.1+",
        ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>"),
        "deepseek_v31",
        "deepseek_v3",  # thinks only when the prompt opened <think> (its non-thinking prompt ends in </think>)
    ),
    FormatRule("Kimi K2", ("<|tool_calls_section_begin|>",), "kimi_k2", "kimi_k2"),
    FormatRule("Mistral / Devstral", ("[TOOL_CALLS]",), "mistral", None),
    FormatRule("Llama 3.x (JSON)", ("<|python_tag|>",), "llama3_json", None),
    FormatRule("Llama 3.x (JSON)", ("<|eot_id|>", '"parameters"'), "llama3_json", None),
    FormatRule("Hermes / Qwen2.5 / Qwen3", ("<tool_call>",), "hermes", "qwen3"),
)


@dataclass(frozen=True)
class ModelFormats:
    tool_parser: str
    reasoning_parser: str
    #: How they were chosen: a family's name, "configured", or "default" (no marker matched).
    source: str


def template_text(chat_template: str | Mapping[str, str] | None) -> str:
    if chat_template is None:
        return ""
    if isinstance(chat_template, str):
        return chat_template
    return "\n".join(chat_template.values())  # named templates (default, tool_use, ...)


def detect_formats(chat_template: str | Mapping[str, str] | None) -> ModelFormats:
    """The formats a chat template's markers say the model writes."""
    text = template_text(chat_template)
    for rule in RULES:
        if all(marker in text for marker in rule.markers):
            return ModelFormats(
                rule.tool_parser, rule.reasoning_parser or DEFAULT_REASONING_PARSER, rule.family
            )
    return ModelFormats(DEFAULT_TOOL_PARSER, DEFAULT_REASONING_PARSER, "default")


def resolve_formats(
    tool_parser: str, reasoning_parser: str, chat_template: str | Mapping[str, str] | None
) -> ModelFormats:
    """The configured names, with ``auto`` replaced by what the template says."""
    detected = detect_formats(chat_template)
    if tool_parser != AUTO and reasoning_parser != AUTO:
        return ModelFormats(tool_parser, reasoning_parser, "configured")
    return ModelFormats(
        detected.tool_parser if tool_parser == AUTO else tool_parser,
        detected.reasoning_parser if reasoning_parser == AUTO else reasoning_parser,
        detected.source,
    )
