"""A long new message is encoded off the event loop, even once incremental splices are trusted.

Once a gateway trusts its incremental splices, ``quick_prompt`` builds the prompt on the event loop
(a few short renders, one short encode). But "short" was never checked: a tool that printed a large
file made the new tail megabytes long, and its render and encode ran on the loop that serves every
other rollout (3.6 M characters: ~2 s here with no other request served), outside the tokenize
timeout too. A new tail of ``QUICK_TAIL_CHARS`` or more now goes to the worker thread with the rest
(the same IDs: ``build_prompt``'s trusted splice). The control: the short messages of the same
rollout keep the quick path.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import openai

from harnessrl.engines.tiny import tiny_model_dir
from harnessrl.gateway.prompt.conversation import QUICK_TAIL_CHARS, VERIFY_CALLS, build_prompt
from harnessrl.gateway.prompt.history import prior_from_call
from harnessrl.gateway.prompt.messages import normalize_messages
from harnessrl.tokenizer import PolicyTokenizer


class LoopWatchingTokenizer(PolicyTokenizer):
    """The real tokenizer, noting the length of each text ``encode`` is given on an event loop's thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_loop: list[int] = []
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a worker thread
        else:
            with self._lock:
                self.on_loop.append(len(text))
        return super().encode(text)


def test_a_long_tool_output_is_not_encoded_on_the_event_loop(make_gateway: Callable[..., Any]) -> None:
    tok = LoopWatchingTokenizer.from_dir(tiny_model_dir(weights=False))
    calls = VERIFY_CALLS + 3
    gw = make_gateway([f"step {k}" for k in range(calls)], policy_tokenizer=tok, context_length=1_000_000)
    rollout = gw.rollout()
    client = openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    history: list[Any] = [{"role": "user", "content": "read the logs"}]
    big = "".join(f"line {i}: error at module_{i % 7}.py\n" for i in range(4000))  # ~130 k characters
    assert len(big) > 3 * QUICK_TAIL_CHARS
    for k in range(calls):
        answer = client.chat.completions.create(model="m", messages=history, max_tokens=8)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
        history.append({"role": "user", "content": big if k == calls - 2 else f"continue {k}"})
    client.close()
    stored = gw.client.list_calls(rollout["rollout_id"])
    assert [c.usage.prompt_source for c in stored] == ["first"] + ["reused"] * (calls - 1)
    # The long message was encoded, but in a worker thread; the short ones on the loop (the control).
    assert tok.on_loop, "the trusted quick path did not run on the event loop at all"
    assert max(tok.on_loop) < QUICK_TAIL_CHARS, max(tok.on_loop)
    # The same prompt as the reference path builds from the stored calls.
    big_call = stored[calls - 1]
    priors = [prior_from_call(c) for c in stored[: calls - 1]]
    messages = normalize_messages(big_call.request["messages"])
    reference = build_prompt(tok, messages, [p for p in priors if p is not None], incremental=False)
    assert reference.result == "reused"
    assert big_call.prompt_token_ids == reference.prompt_ids
