"""Request fields the gateway acts on, checked as the providers check them, against a real gateway on
127.0.0.1 (scripted engine) driven by the official SDKs and raw HTTP (each case was found on a live
gateway):

- a stop list of any length was accepted, and every sampled token is checked against every stop
  string on the event loop: 40,000 of them held it ~30 ms a token (every other rollout waiting);
- pydantic's lax mode read ``"max_tokens": true`` as a one-token budget, ``"7"`` as 7 and
  ``"stream": "yes"`` as a stream, where OpenAI and Anthropic answer 400;
- a Messages call over the context named the harness's ``max_tokens`` in Anthropic's wording
  (which Claude Code parses), not the budget the gateway's ``max_tokens`` cap made of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from harnessrl.gateway.body_models import MAX_STOP_STRINGS

USER = [{"role": "user", "content": "hi"}]


def _openai(rollout: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def _anthropic(gw: Any, rollout: dict[str, Any]) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"{gw.url}/rollouts/{rollout['rollout_id']}", api_key=rollout["api_key"], max_retries=0
    )


def _call(api: str, gw: Any, rollout: dict[str, Any], stops: list[str], stream: bool) -> None:
    """One call of ``api`` through its SDK with ``stops`` as its stop list, read to the end."""
    if api == "messages":
        client = _anthropic(gw, rollout)
        args: dict[str, Any] = dict(model="c", max_tokens=16, messages=USER, stop_sequences=stops)
        if stream:
            with client.messages.stream(**args) as events:
                events.get_final_message()
        else:
            client.messages.create(**args)
        return
    sdk = _openai(rollout)
    if api == "chat":
        answer: Any = sdk.chat.completions.create(model="m", messages=USER, stop=stops, stream=stream)
    elif api == "completions":
        answer = sdk.completions.create(model="m", prompt="hi", stop=stops, stream=stream)
    else:  # responses: ``stop`` is the gateway's extension there, as vLLM's
        answer = sdk.responses.create(model="m", input="hi", extra_body={"stop": stops}, stream=stream)
    if stream:
        list(answer)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["chat", "completions", "responses", "messages"])
def test_a_long_stop_list_is_refused_before_anything_is_generated(
    make_gateway: Callable[..., Any], api: str, stream: bool
) -> None:
    gw = make_gateway(counting=True)
    rollout = gw.rollout()
    too_many = [f"never-{i}" for i in range(MAX_STOP_STRINGS + 1)]
    error: type[Exception] = anthropic.BadRequestError if api == "messages" else openai.BadRequestError
    with pytest.raises(error) as refused:  # type: ignore[call-overload]
        _call(api, gw, rollout, too_many, stream)
    assert f"at most {MAX_STOP_STRINGS} stop strings" in str(refused.value)
    if api != "messages":  # OpenAI's shape names the field
        assert refused.value.body["param"] == "stop"  # type: ignore[attr-defined]
    assert gw.engine.started == 0 and gw.store.list_calls(rollout["rollout_id"]) == []
    # Control: the most a request may set is served and recorded.
    _call(api, gw, rollout, too_many[:MAX_STOP_STRINGS], stream)
    assert gw.engine.started == 1 and len(gw.store.list_calls(rollout["rollout_id"])) == 1


GOOD = {
    "chat/completions": {"model": "m", "messages": USER, "max_tokens": 4},
    "completions": {"model": "m", "prompt": "hi", "max_tokens": 4},
    "responses": {"model": "m", "input": "hi", "max_output_tokens": 4},
    "messages": {"model": "m", "messages": USER, "max_tokens": 4},
}


@pytest.mark.parametrize(
    ("path", "field", "bad", "good"),
    [
        ("chat/completions", "max_tokens", True, 4),
        ("chat/completions", "max_tokens", "4", 4.0),  # an integral float is still a number
        ("chat/completions", "max_completion_tokens", True, 4),
        ("chat/completions", "temperature", "0.5", 1),
        ("chat/completions", "temperature", True, 0.5),
        ("chat/completions", "seed", "12", 12),
        ("chat/completions", "stream", "yes", False),
        ("chat/completions", "logprobs", "on", True),
        ("chat/completions", "n", True, 1),
        ("chat/completions", "stream_options", {"include_usage": 1}, {"include_usage": True}),
        ("completions", "max_tokens", True, 4),
        ("completions", "logprobs", True, 1),
        ("completions", "echo", "false", False),
        ("responses", "max_output_tokens", True, 4),
        ("responses", "store", "false", False),
        ("responses", "parallel_tool_calls", 1, True),
        ("messages", "max_tokens", True, 4),
        ("messages", "max_tokens", "4", 4),
        ("messages", "temperature", "0.5", 0.5),
        ("messages", "stream", "yes", False),
        ("messages", "top_k", True, 5),
    ],
)  # fmt: skip
def test_values_of_another_json_type_are_a_400_naming_the_field(
    make_gateway: Callable[..., Any], path: str, field: str, bad: Any, good: Any
) -> None:
    """pydantic's lax mode converted them: ``"max_tokens": true`` answered one token."""
    gw = make_gateway(counting=True)
    rollout = gw.rollout()
    url = f"{gw.url}/rollouts/{rollout['rollout_id']}/v1/{path}"
    headers = {"authorization": f"Bearer {rollout['api_key']}"}
    refused = httpx.post(url, json={**GOOD[path], field: bad}, headers=headers, timeout=30)
    assert refused.status_code == 400, refused.text
    body = refused.json()
    if path == "messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert field in body["error"]["message"]
    else:
        assert body["error"]["param"].split(".")[0] == field, body
    assert gw.engine.started == 0 and gw.store.list_calls(rollout["rollout_id"]) == []
    # Control: the same field with a value of its own type is served.
    served = httpx.post(url, json={**GOOD[path], field: good}, headers=headers, timeout=30)
    assert served.status_code == 200, served.text
    assert len(gw.store.list_calls(rollout["rollout_id"])) == 1


@pytest.mark.parametrize("cap", [None, 24])
def test_a_messages_call_over_the_context_names_the_budget_that_was_checked(
    make_gateway: Callable[..., Any], cap: int | None
) -> None:
    """``gateway.max_tokens`` cuts the harness's ``max_tokens`` before the context check; Anthropic's
    wording (``P + T > C``, which Claude Code parses to lower its budget) must name the cut one."""
    gw = make_gateway(context_length=30, **({} if cap is None else {"max_tokens": cap}))
    client = _anthropic(gw, gw.rollout())
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="c", max_tokens=1000, messages=USER)
    found = re.search(r"exceed context limit: (\d+) \+ (\d+) > (\d+)", str(refused.value))
    assert found is not None, str(refused.value)
    prompt, budget, context = map(int, found.groups())
    assert context == 30 and prompt + budget > context
    assert budget == (1000 if cap is None else cap)


@pytest.mark.parametrize(
    ("field", "refused", "accepted"),
    [("echo", True, False), ("suffix", "\n}\n", ""), ("suffix", "x", None)],
)
def test_completions_echo_and_suffix_are_refused_not_ignored(
    make_gateway: Callable[..., Any], field: str, refused: Any, accepted: Any
) -> None:
    """Ignored, ``echo`` answered a harness that scores its prompt's logprobs (lm-eval's
    loglikelihood: ``echo``, ``max_tokens: 1``, ``logprobs: 1``) with one new token, scored as
    nothing; a ``suffix`` (fill in the middle) got a plain continuation."""
    gw = make_gateway(counting=True)
    rollout = gw.rollout()
    sdk = _openai(rollout)
    args: dict[str, Any] = dict(model="m", prompt="hi", max_tokens=1, logprobs=1)
    with pytest.raises(openai.BadRequestError) as error:
        sdk.completions.create(**args, **{field: refused})
    assert error.value.body["param"] == field  # type: ignore[index]
    assert gw.engine.started == 0 and gw.store.list_calls(rollout["rollout_id"]) == []
    # Control: the values that ask for nothing else are served.
    answer = sdk.completions.create(**args, **{field: accepted})
    assert answer.choices[0].text and len(gw.store.list_calls(rollout["rollout_id"])) == 1
