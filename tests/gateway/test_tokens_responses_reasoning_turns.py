"""A Responses answer whose reasoning comes after its text or its calls, sent back item by item,
is one assistant turn again: the next prompt holds no turn the policy never wrote.

``glm45`` opens a new reasoning block wherever the model writes ``<think>`` in its answer (its
reasoning parser's grammar), so one answer's output items can be ``reasoning, message,
function_call, reasoning``. A harness such as Codex sends its history back as those items. The
input converter opened a new assistant message at every ``reasoning`` item, so the echoed answer
became two assistant messages: the first matched the recorded answer (the call was recorded as
``reused``), and the second, empty one was rendered into the new tail, so the engine conditioned on
an empty assistant turn (``<|im_start|>assistant\\n<|im_end|>``) that the policy never sampled, and
the trainer put it in the sample's context. ``gateway/apis/responses_input.py``
(``_Builder.reasoning``) now keeps a reasoning item in the open assistant turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = [{"type": "function", "name": "bash", "parameters": SCHEMA}]
CALL = "<tool_call>bash\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
GLM = {"tool_call_parser": "glm45", "reasoning_parser": "glm45"}


def _two_calls(gateway: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """A first call, and a second that sends its output items back with the call's output."""
    rollout = gateway.rollout()
    url = rollout["base_url"] + "/responses"
    headers = {"Authorization": f"Bearer {rollout['api_key']}"}
    with httpx.Client(timeout=60) as http:
        first = http.post(
            url, headers=headers, json={"model": "m", "input": "List the files.", "tools": TOOLS}
        )
        assert first.status_code == 200, first.text
        output = first.json()["output"]
        outputs = [
            {"type": "function_call_output", "call_id": item["call_id"], "output": "a.py"}
            for item in output
            if item["type"] == "function_call"
        ] or [{"role": "user", "content": "Go on."}]
        history = [{"role": "user", "content": "List the files."}, *output, *outputs]
        second = http.post(url, headers=headers, json={"model": "m", "input": history, "tools": TOOLS})
        assert second.status_code == 200, second.text
    return gateway.client.list_calls(rollout["rollout_id"]), output


def _new_text(tokenizer: Any, calls: list[Any]) -> str:
    first, second = calls
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[: len(head)] == head
    return tokenizer.decode(second.prompt_token_ids[len(head) :])


@pytest.mark.parametrize(
    "answer",
    [
        "<think>first</think>Let me look." + CALL + "<think>then this</think>",  # reasoning after the call
        "<think>first</think>Let me look.<think>then this</think>Done.",  # reasoning after the text
    ],
)
def test_reasoning_after_the_answer_started_stays_in_its_turn(
    make_gateway: Callable[..., Any], tokenizer: Any, answer: str
) -> None:
    gateway = make_gateway([answer, "ok"], **GLM)
    calls, output = _two_calls(gateway)
    assert [item["type"] for item in output].count("reasoning") == 2  # the shape this is about
    assert calls[1].usage is not None and calls[1].usage.prompt_source == "reused"
    assert "<|im_start|>assistant\n<|im_end|>" not in _new_text(tokenizer, calls)


def test_control_reasoning_before_the_answer_adds_no_turn(
    make_gateway: Callable[..., Any], tokenizer: Any
) -> None:
    # The common shape (reasoning first): the tail is the tool output and the generation prompt.
    gateway = make_gateway(["<think>first</think>Let me look." + CALL, "ok"], **GLM)
    calls, output = _two_calls(gateway)
    assert [item["type"] for item in output] == ["reasoning", "message", "function_call"]
    assert calls[1].usage is not None and calls[1].usage.prompt_source == "reused"
    assert _new_text(tokenizer, calls) == (
        "\n<|im_start|>user\n<tool_response>\na.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
