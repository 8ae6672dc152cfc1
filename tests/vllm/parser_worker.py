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
            reasoning, content = None, case["text"]
            if case.get("reasoning_parser"):
                parser = ReasoningParserManager.get_reasoning_parser(case["reasoning_parser"])(tokenizer)
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


if __name__ == "__main__":
    main()
