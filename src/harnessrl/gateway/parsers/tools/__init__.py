"""Tool-call parsers: sampled text -> OpenAI ``tool_calls``, per model family, in a registry.

Each family's parser is a module of this package (``hermes``, ``qwen_xml``, ``glm``, ...), built on
``base``; docs/gateway.md ("Model families") lists them, how each is detected and how it was tested. The gateway
picks one by name (``[gateway] tool_call_parser``); ``parse_tool_calls`` is the non-streaming view.
"""

from __future__ import annotations

from harnessrl.errors import ConfigError
from harnessrl.gateway.parsers.tools.base import (
    ContentEvent,
    ContentWhitespace,
    CountingParser,
    Event,
    HeldWhitespace,
    ParsedMessage,
    ToolCall,
    ToolCallEvent,
    ToolParser,
    ToolParserFactory,
    Tools,
    collect,
    partial_suffix,
)
from harnessrl.gateway.parsers.tools.deepseek import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from harnessrl.gateway.parsers.tools.glm import GlmToolParser
from harnessrl.gateway.parsers.tools.harmony import HarmonyToolParser
from harnessrl.gateway.parsers.tools.hermes import HermesToolParser
from harnessrl.gateway.parsers.tools.kimi import KimiK2ToolParser
from harnessrl.gateway.parsers.tools.llama import Llama3JsonToolParser
from harnessrl.gateway.parsers.tools.mistral import MistralToolParser
from harnessrl.gateway.parsers.tools.qwen_xml import QwenXmlToolParser

__all__ = [
    "TOOL_PARSERS",
    "ContentEvent",
    "ContentWhitespace",
    "DeepSeekV3ToolParser",
    "DeepSeekV31ToolParser",
    "CountingParser",
    "Event",
    "GlmToolParser",
    "HeldWhitespace",
    "HarmonyToolParser",
    "HermesToolParser",
    "KimiK2ToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "QwenXmlToolParser",
    "ParsedMessage",
    "ToolCall",
    "ToolCallEvent",
    "ToolParser",
    "ToolParserFactory",
    "Tools",
    "collect",
    "get_tool_parser",
    "parse_tool_calls",
    "partial_suffix",
]

# vLLM's names (``--tool-call-parser``), so a model's documented vLLM setting works here too.
TOOL_PARSERS: dict[str, ToolParserFactory] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,  # Qwen2.5 / Qwen3 (JSON in <tool_call>)
    "qwen3_coder": QwenXmlToolParser,  # Qwen3-Coder, Qwen3.5 (XML in <tool_call>)
    "qwen3_xml": QwenXmlToolParser,
    "glm45": GlmToolParser,
    "glm47": GlmToolParser,
    "openai": HarmonyToolParser,  # gpt-oss (harmony channels)
    "llama3_json": Llama3JsonToolParser,  # Llama 3.x: JSON, after <|python_tag|> or bare
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,  # [TOOL_CALLS][...] and [TOOL_CALLS]NAME[ARGS]{...}
    "deepseek_v3": DeepSeekV3ToolParser,  # DeepSeek V3, R1
    "deepseek_v31": DeepSeekV31ToolParser,  # DeepSeek V3.1+
    "kimi_k2": KimiK2ToolParser,
}


def get_tool_parser(name: str) -> ToolParserFactory:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ConfigError(f"gateway.tool_call_parser: unknown parser {name!r} (known: {known})") from None


def parse_tool_calls(text: str, parser: str = "hermes", tools: Tools = None) -> ParsedMessage:
    p = get_tool_parser(parser)(tools)
    return collect(p.feed(text) + p.finish())
