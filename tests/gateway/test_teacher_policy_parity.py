"""Teacher mode answers the turn the policy path would: it refuses what the policy path refuses and
samples as the rollout says.

A teacher upstream (vLLM, a provider) honours fields the policy path refuses: ``n: 2`` (the harness
got two choices, one was recorded), ``continue_final_message``, ``add_generation_prompt: false``,
``echo`` (the recorded "answer" was a continuation or an echo, recorded as a whole new turn), and
Anthropic continues a prefill (a trailing assistant message). Each is refused here with the policy
path's own 400 (compared with a policy gateway's answer to the same body), before the upstream is
asked. And the rollout's ``metadata.sampling`` (greedy evaluations, the trainer's temperature, a cap
on the answer) reaches the upstream as the policy path applies it to the engine.

The upstreams are the small real servers of ``test_teacher_apis`` (they record what they were asked);
the policy gateway is the ``make_gateway`` fixture's; the harnesses are the official SDKs and httpx.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.gateway.test_teacher_apis import claude, native_upstream, small_upstream, teacher_on

from harnessrl.store.sqlite import SQLiteStore
from harnessrl.tokenizer import PolicyTokenizer

USER = [{"role": "user", "content": "What is in a.txt?"}]
PREFILL = [*USER, {"role": "assistant", "content": "The file holds"}]
ANTHROPIC = {"anthropic-version": "2023-06-01"}

#: Chat fields the policy path refuses (each one: the answer would not be one new assistant turn).
REFUSED_CHAT = [{"n": 2}, {"continue_final_message": True}, {"add_generation_prompt": False}, {"echo": True}]


def _post(base_url: str, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key, **ANTHROPIC}
    return httpx.post(f"{base_url.rstrip('/')}/{path}", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_teacher_chat_refuses_what_the_policy_path_refuses(
    tmp_path: Path, tokenizer: PolicyTokenizer, make_gateway: Any, stream: bool
) -> None:
    policy = make_gateway(["unused"]).rollout()
    upstream = small_upstream()
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with teacher_on(upstream, store, tokenizer) as (sdk, rollout_id):
            for extra in REFUSED_CHAT:
                body = {"model": "m", "messages": USER, "stream": stream, **extra}
                want = _post(policy["base_url"], policy["api_key"], "chat/completions", body)
                assert want.status_code == 400, (extra, want.text)
                got = _post(str(sdk.base_url), sdk.api_key, "chat/completions", body)
                assert (got.status_code, got.json()) == (400, want.json()), extra
            assert upstream.state.asked == []  # refused before the upstream was asked
            assert store.list_calls(rollout_id) == []
            # Control: the values that say "one new turn" are accepted and the call goes through.
            fine = {"n": 1, "continue_final_message": False, "add_generation_prompt": True, "echo": False}
            ok = _post(
                str(sdk.base_url), sdk.api_key, "chat/completions", {"model": "m", "messages": USER, **fine}
            )
            assert ok.status_code == 200, ok.text
            assert len(upstream.state.asked) == 1 and len(store.list_calls(rollout_id)) == 1
    finally:
        store.close()


@pytest.mark.parametrize("api", ["chat", "native"])
def test_teacher_messages_refuse_a_prefill_as_the_policy_path_does(
    tmp_path: Path, tokenizer: PolicyTokenizer, make_gateway: Any, api: str
) -> None:
    """A conversation ending with an assistant message asks Anthropic to continue it: translated
    (``api = "chat"``) or forwarded (``"native"``), the teacher refused nothing and the continuation
    was recorded as the answer."""
    policy = make_gateway(["unused"]).rollout()
    body = {"model": "c", "max_tokens": 10, "messages": PREFILL}
    want = _post(policy["base_url"], policy["api_key"], "messages", body)
    assert want.status_code == 400 and "prefill" in want.text
    upstream = small_upstream() if api == "chat" else native_upstream(cut=False)
    store = SQLiteStore(tmp_path / "teacher.db")
    try:
        with teacher_on(upstream, store, tokenizer, api=api) as (sdk, rollout_id):
            for stream in (False, True):
                got = _post(str(sdk.base_url), sdk.api_key, "messages", {**body, "stream": stream})
                assert (got.status_code, got.json()) == (400, want.json())
            assert upstream.state.asked == [] and store.list_calls(rollout_id) == []
            # Control: the conversation without the prefill is answered and recorded.
            with claude(sdk).messages.stream(model="c", max_tokens=10, messages=USER) as answer:  # type: ignore[arg-type]
                answer.get_final_message()
            assert len(upstream.state.asked) == 1 and len(store.list_calls(rollout_id)) == 1
    finally:
        store.close()


SAMPLING = {"temperature": 0.0, "top_p": 0.5, "max_tokens": 7}
ASKED = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "max_output_tokens")


def _asked(upstream: Any) -> list[dict[str, Any]]:
    return [{k: body[k] for k in ASKED if k in body} for body in upstream.state.asked]


def test_teacher_calls_sample_as_the_rollouts_metadata_sampling_says(
    tmp_path: Path, tokenizer: PolicyTokenizer
) -> None:
    """Temperature and top_p replace the harness's, max_tokens caps its answer length (with
    ``gateway.max_tokens``, the lower of the two), in every API and both teacher kinds; the recorded
    request stays the harness's, as on the policy path."""
    store = SQLiteStore(tmp_path / "teacher.db")
    metadata = {"sampling": SAMPLING}
    try:
        upstream = small_upstream()
        with teacher_on(upstream, store, tokenizer, metadata=metadata) as (sdk, rollout_id):
            sdk.chat.completions.create(model="m", messages=USER, temperature=1.5, top_p=1.0, max_tokens=100)  # type: ignore[arg-type]
            sdk.chat.completions.create(model="m", messages=USER, max_completion_tokens=3)  # type: ignore[arg-type]
            messages = {"model": "c", "max_tokens": 20000, "temperature": 1.0, "messages": USER}
            assert _post(str(sdk.base_url), sdk.api_key, "messages", messages).status_code == 200
            sdk.responses.create(model="g", input="x", temperature=1.2)
            assert store.list_calls(rollout_id)[0].request["temperature"] == 1.5  # as the harness sent it
        assert _asked(upstream) == [
            {"temperature": 0.0, "top_p": 0.5, "max_tokens": 7},
            {"temperature": 0.0, "top_p": 0.5, "max_completion_tokens": 3},  # under the cap: kept
            {"temperature": 0.0, "top_p": 0.5, "max_tokens": 7},
            {"temperature": 0.0, "top_p": 0.5, "max_tokens": 7},
        ]
        capped = small_upstream()
        with teacher_on(capped, store, tokenizer, metadata=metadata, max_tokens=5) as (sdk, _):
            sdk.chat.completions.create(model="m", messages=USER, max_tokens=100)  # type: ignore[arg-type]
        assert _asked(capped) == [{"temperature": 0.0, "top_p": 0.5, "max_tokens": 5}]
        native = native_upstream(cut=False)
        with teacher_on(native, store, tokenizer, api="native", metadata=metadata) as (sdk, _):
            streamed = {
                "model": "c",
                "max_tokens": 20000,
                "temperature": 1.0,
                "messages": USER,
                "stream": True,
            }
            assert "message_stop" in _post(str(sdk.base_url), sdk.api_key, "messages", streamed).text
            list(sdk.responses.create(model="g", input="x", temperature=1.2, stream=True))
        assert _asked(native) == [
            {"temperature": 0.0, "top_p": 0.5, "max_tokens": 7},
            {"temperature": 0.0, "top_p": 0.5, "max_output_tokens": 7},
        ]
        plain = small_upstream()  # control: a rollout without overrides is asked as the harness asked
        with teacher_on(plain, store, tokenizer) as (sdk, _):
            sdk.chat.completions.create(model="m", messages=USER, temperature=1.5, max_tokens=100)  # type: ignore[arg-type]
        assert _asked(plain) == [{"temperature": 1.5, "max_tokens": 100}]
    finally:
        store.close()
