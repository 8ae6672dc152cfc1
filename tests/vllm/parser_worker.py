"""Runs vLLM's own tool-call and reasoning parsers on texts: the reference for harnessrl's parsers.

Run by ``tests/vllm/parser_reference.py`` under the Python that has vLLM (``.venv-vllm``), never
imported by the test process (which has no vLLM). Reads one JSON object on stdin::

    {"tokenizer_dir": "...", "special_tokens": ["<tool_call>", ...],
     "cases": [{"tool_parser": "hermes" | null, "reasoning_parser": "qwen3" | null,
                "text": "...", "tools": [<OpenAI tool>, ...]}]}

and writes one JSON list, a result per case, to the file named by its one argument (vLLM may
print to stdout): ``{"reasoning", "content", "tool_calls":
[{"name", "arguments"}]}`` (arguments parsed from their JSON string) or ``{"error": "..."}``. The
reasoning parser runs first and the tool parser sees only the content, as vLLM's server does.
``special_tokens`` are added to the tokenizer, because several of vLLM's parsers look their
markers up in the vocabulary.

Two optional case keys, absent from the older cases:

- ``"chat_template_kwargs": {...}`` is passed to the reasoning parser as vLLM's server does (its
  engine parsers read ``enable_thinking`` / ``thinking`` from it; without it they assume thinking on).
- ``"harmony": true`` reads the text as gpt-oss does: it is encoded with ``openai_harmony``'s
  gpt-oss encoding (special tokens allowed) and the token ids go through vLLM's ``HarmonyParser``
  with its ``openai_gptoss`` reasoning and ``openai`` tool parsers. ``reasoning_parser`` and
  ``tool_parser`` are ignored for such a case (Harmony always uses both).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    request = json.load(sys.stdin)
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    tokenizer = AutoTokenizer.from_pretrained(request["tokenizer_dir"])
    if request.get("special_tokens"):
        tokenizer.add_special_tokens({"additional_special_tokens": request["special_tokens"]})
    results: list[dict[str, Any]] = []
    for case in request["cases"]:
        try:
            body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            if case.get("tools"):
                body["tools"] = case["tools"]
            chat = ChatCompletionRequest(**body)
            if case.get("harmony"):
                results.append(harmony_parse(case["text"], chat))
                continue
            reasoning, content = None, case["text"]
            if case.get("reasoning_parser"):
                parser_class = ReasoningParserManager.get_reasoning_parser(case["reasoning_parser"])
                if "chat_template_kwargs" in case:
                    parser = parser_class(tokenizer, chat_template_kwargs=case["chat_template_kwargs"])
                else:
                    parser = parser_class(tokenizer)
                reasoning, content = parser.extract_reasoning(case["text"], chat)
            calls: list[dict[str, Any]] = []
            if case.get("tool_parser") and content is not None:
                tool_parser = ToolParserManager.get_tool_parser(case["tool_parser"])(tokenizer, chat.tools)
                extracted = tool_parser.extract_tool_calls(content, chat)
                if extracted.tools_called:
                    content = extracted.content
                    calls = [
                        {"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                        for c in extracted.tool_calls
                    ]
            results.append({"reasoning": reasoning, "content": content, "tool_calls": calls})
        except Exception as exc:  # a parser that raises is a result too: ours must not 500
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(results, out)


class _HarmonyTokenizer:
    """The little of a tokenizer ``HarmonyParser`` touches (``decode`` when it recovers raw text)."""

    def __init__(self, encoding: Any) -> None:
        self._encoding = encoding

    def decode(self, token_ids: list[int], **_: Any) -> str:
        return self._encoding.decode(token_ids)

    def get_vocab(self) -> dict[str, int]:
        return {}


def harmony_parse(text: str, chat: Any) -> dict[str, Any]:
    """vLLM's reading of a gpt-oss completion, from the token ids Harmony's encoding gives ``text``."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    from vllm.parser.harmony import HarmonyParser
    from vllm.reasoning.gptoss_reasoning_parser import GptOssReasoningParser
    from vllm.tool_parsers.gptoss_tool_parser import GptOssToolParser

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    token_ids = encoding.encode(text, allowed_special="all")
    parser_class = type(
        "ReferenceHarmonyParser",
        (HarmonyParser,),
        {"reasoning_parser_cls": GptOssReasoningParser, "tool_parser_cls": GptOssToolParser},
    )
    parser = parser_class(_HarmonyTokenizer(encoding), chat.tools)
    reasoning, content, calls = parser.parse(text, chat, model_output_token_ids=token_ids)
    return {
        "reasoning": reasoning,
        "content": content,
        "tool_calls": [{"name": c.name, "arguments": _json_or_text(c.arguments)} for c in calls or []],
    }


def _json_or_text(arguments: str) -> Any:
    """Harmony passes arguments that are not JSON through as text; keep them so a test can see that."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


if __name__ == "__main__":
    main()
