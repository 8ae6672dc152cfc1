"""An ordinary OpenAI-SDK agent with a calculator tool — nothing in it knows about harnessrl.

It reads its question from the command line, talks to whatever ``OPENAI_BASE_URL`` /
``OPENAI_API_KEY`` point at, runs the ``calculator`` tool when the model asks for it, and prints the
model's final answer. harnessrl's controller launches it unmodified; the evaluator scores the
answer from the recorded calls, not from anything the agent claims.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
                "required": ["expression"],
            },
        },
    }
]

SYSTEM = (
    "You are a careful math assistant. Use the calculator tool when it helps. "
    "End your reply with 'Answer: <number>'."
)

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """Evaluate arithmetic safely (no names, no calls); errors are returned as text to the model."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError("unsupported expression")

    try:
        value = walk(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("question")
    parser.add_argument("--model", default=os.environ.get("HARNESSRL_MODEL", "policy"))
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    client = OpenAI(max_retries=2, timeout=600)
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.question}]
    for _ in range(args.max_turns):
        reply = client.chat.completions.create(
            model=args.model,
            messages=messages,
            tools=TOOLS,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(message.content or "")
            return
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            result = calculate(expression) if call.function.name == "calculator" else "error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    # Out of turns: the model's last words, never the calculator's (the last message is a tool
    # result: printing it handed the computed value to a scorer of stdout as the model's answer).
    print(next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""))


if __name__ == "__main__":
    main()
