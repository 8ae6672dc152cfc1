"""Calls stored as deltas on their chain (``store.chains``), on every backend in ``conftest.BACKENDS``.

The property: whatever a rollout's history does (turns appended, a message edited or removed,
a subagent's calls interleaved with the main agent's, a retried request, a new attempt, the
``completions`` API with no messages, Responses ``input`` lists and strings, a changed frame),
every call read back equals the call written, through one store's memory, a second store writing
the same rollout, a batch (``add_calls``) and a fresh store reading and extending it. And the
goal of issue 22: a 50-call rollout over a growing context stores about its final call's bytes.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.store.calls import agent_trace
from tests.store.test_migrations import raw_connection

from harnessrl.errors import HarnessRLError
from harnessrl.schemas import Call, Usage
from harnessrl.store import Store
from harnessrl.store.chains import AttemptChains, Chain, ChainCache, Link
from harnessrl.store.codecs import call_from_row, dump_call_json, dump_json

APIS = ("chat.completions", "responses", "messages", "completions")
SYSTEM_TOKENS = list(range(1000, 1040))  # a system prompt the main agent and its subagents share


def _text(rng: random.Random, words: int) -> str:
    return " ".join(
        rng.choice(("ls", "cat", "fix", "test ☃", "a\nb", '"q"', "\u0000", "x" * 9)) for _ in range(words)
    )


@dataclass
class Agent:
    """One conversation of a rollout (the main agent or a subagent), in one API's shapes."""

    api: str
    rng: random.Random
    frame: dict[str, Any]
    items: list[Any] = field(default_factory=list)
    text: str = ""  # the completions API's growing prompt
    prompt: list[int] = field(default_factory=list)
    last: Call | None = None
    tool_calls: int = 0

    @classmethod
    def start(cls, thread: int, api: str) -> Agent:
        # Seeded by thread and API only: a new attempt replays the same first turns, which must
        # still never be stored on the abandoned attempt's calls.
        rng = random.Random(f"{thread}-{api}")
        frames = {
            "chat.completions": {"model": "m", "temperature": 0.7, "tools": [{"name": "bash"}]},
            "responses": {"model": "m", "instructions": "be brief", "store": False},
            "messages": {"model": "m", "system": "you are an agent", "max_tokens": 64},
            "completions": {"model": "m", "max_tokens": 16},
        }
        agent = cls(api, rng, frames[api], prompt=SYSTEM_TOKENS + [rng.randrange(50) for _ in range(5)])
        first = _text(rng, 3)
        if api == "completions":
            agent.text = first
        elif api == "responses" and thread == 1:
            agent.items = None  # type: ignore[assignment]  # a string input first, a list later
            agent.text = first
        else:
            agent.items = [agent.user_item(first)]
        return agent

    def user_item(self, text: str) -> dict[str, Any]:
        if self.api == "responses":
            return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        return {"role": "user", "content": text}

    def answer_items(self, answer: str, observation: str) -> list[Any]:
        self.tool_calls += 1
        tool_id = f"call_{self.tool_calls}"
        if self.api == "responses":
            return [
                {"type": "function_call", "call_id": tool_id, "name": "bash", "arguments": answer},
                {"type": "function_call_output", "call_id": tool_id, "output": observation},
            ]
        if self.api == "messages":
            return [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": tool_id, "input": {"c": answer}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": observation}],
                },
            ]
        return [
            {"role": "assistant", "content": answer, "tool_calls": [{"id": tool_id, "arguments": "{}"}]},
            {"role": "tool", "tool_call_id": tool_id, "content": observation},
        ]

    def request(self) -> dict[str, Any]:
        if self.api == "completions":
            return {**self.frame, "prompt": self.text}
        history = self.text if self.items is None else list(self.items)
        return {**self.frame, ("input" if self.api == "responses" else "messages"): history}

    # -- what a harness does next ---------------------------------------------------------------
    def turn(self) -> None:
        """The last answer and a new observation appended; the prompt extends the last call's."""
        if self.last is None:
            return
        answer, observation = self.last.response["content"], _text(self.rng, 4)
        if self.api == "completions" or self.items is None:
            self.text += answer + observation
            if self.items is None:
                self.items = [self.user_item(self.text)]
        else:
            self.items += self.answer_items(answer, observation)
        new = [self.rng.randrange(50) for _ in range(self.rng.randrange(0, 8))]
        self.prompt = self.prompt + self.last.response_token_ids + new

    def edit(self, remove: bool) -> None:
        """A message changed (or removed) and a token of the prompt changed (or a few removed)."""
        self.turn()
        if isinstance(self.items, list) and self.items:
            i = self.rng.randrange(len(self.items))
            if remove:
                del self.items[i]
            else:
                self.items[i] = self.user_item("edited " + _text(self.rng, 2))
        elif self.text:
            self.text = "compacted " + self.text[len(self.text) // 2 :]
        if self.prompt:
            i = self.rng.randrange(len(self.prompt))
            if remove:
                del self.prompt[i : i + 3]
            else:
                self.prompt[i] = (self.prompt[i] + 1) % 2**31

    def reframe(self) -> None:
        self.turn()
        self.frame = {**self.frame, "temperature": self.rng.choice((0.0, 1.0, -0.0)), "seed": 7}

    def call(self, rollout_id: str, attempt: int) -> Call:
        n = self.rng.randrange(0, 6)
        return Call(
            rollout_id=rollout_id,
            attempt=attempt,
            api=self.api,
            request=self.request(),
            response={"role": "assistant", "content": _text(self.rng, 2)},
            prompt_token_ids=list(self.prompt),
            response_token_ids=[self.rng.randrange(50, 2**31) for _ in range(n)],
            response_logprobs=[-self.rng.random() for _ in range(n)],
            usage=Usage(prompt_tokens=len(self.prompt), completion_tokens=n),
            finish_reason=self.rng.choice(("stop", "tool_calls")),
        )


OPS = ("turn", "turn", "turn", "edit", "remove", "retry", "reframe", "attempt")


@dataclass
class Rollout:
    """Drives a rollout's history through the stores and remembers what was written."""

    rollout_id: str
    stores: list[Store]
    apis: tuple[str, str]
    attempt: int = 0
    agents: dict[int, Agent] = field(default_factory=dict)
    batch: list[Call] = field(default_factory=list)
    written: list[Call] = field(default_factory=list)

    def step(self, op: str, thread: int, how: int) -> None:
        if op == "attempt":
            self.flush()
            self.attempt += 1
            self.agents = {}
            return
        agent = self.agents.get(thread)
        if agent is None:
            agent = self.agents[thread] = Agent.start(thread, self.apis[thread])
        elif op == "turn":
            agent.turn()
        elif op in ("edit", "remove"):
            agent.edit(remove=op == "remove")
        elif op == "reframe":
            agent.reframe()
        # "retry": the same request and prompt again
        call = agent.call(self.rollout_id, self.attempt)
        agent.last = call
        if how == 2:  # wait for a batch (the gateway's group commit)
            self.batch.append(call)
            if len(self.batch) >= 3:
                self.flush()
            return
        self.flush()
        self.written.append(self.stores[how % len(self.stores)].add_call(call))

    def flush(self) -> None:
        if self.batch:
            results = self.stores[0].add_calls(self.batch)
            assert all(isinstance(r, Call) for r in results), results
            self.written += results  # type: ignore[arg-type]
            self.batch = []

    def check(self, store: Store) -> None:
        self.flush()
        assert [c.seq for c in self.written] == list(range(len(self.written)))
        assert store.list_calls(self.rollout_id) == self.written
        for attempt in range(self.attempt + 1):
            mine = [c for c in self.written if c.attempt == attempt]
            assert store.list_calls(self.rollout_id, attempt=attempt) == mine
        assert store.count_calls(self.rollout_id) == len(self.written)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 1), st.integers(0, 2)), min_size=1, max_size=24
    ),
    apis=st.tuples(st.sampled_from(APIS), st.sampled_from(APIS)),
)
def test_random_histories_read_back_exactly(
    store_factory: Any, ops: list[tuple[str, int, int]], apis: tuple[str, str]
) -> None:
    stores = [store_factory() for _ in range(2 if store_factory.shared else 1)]
    rollout = Rollout(stores[0].create_rollout().rollout_id, stores, apis)
    for op, thread, how in ops:
        rollout.step(op, thread, how)
    for store in stores:
        rollout.check(store)
    if store_factory.shared:  # a fresh store: no memory of the chains, reads and extends them from rows
        fresh = store_factory()
        rollout.check(fresh)
        rollout.stores = [fresh]
        rollout.step("turn", 0, 0)
        rollout.check(fresh)
        rollout.check(stores[0])
        fresh.close()
    for store in stores:
        store.close()


# -- what the rows hold ---------------------------------------------------------------------------


def stored_rows(url: str, rollout_id: str) -> list[dict[str, Any]]:
    with raw_connection(url) as (conn, mark):
        cursor = conn.execute(f"SELECT * FROM calls WHERE rollout_id = {mark} ORDER BY seq", (rollout_id,))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def stored_bytes(rows: list[dict[str, Any]]) -> int:
    """Every stored column's length, as the database holds it (token IDs, JSON text, ids...)."""
    return sum(len(v) for row in rows for v in row.values() if isinstance(v, str | bytes | memoryview))


def final_call_bytes(call: Call) -> int:
    """The issue's yardstick: the final call's prompt + response token IDs (int32) and its request."""
    return 4 * (len(call.prompt_token_ids) + len(call.response_token_ids)) + len(dump_json(call.request))


def test_bytes_grow_linearly_with_the_rollout(shared_store_factory: Any) -> None:
    """50 calls over a context growing to ~19k tokens: the rollout stores <= 1.5x its final call."""
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    trace = agent_trace(rollout_id, 50, system=1500, observation=300, answer=60)
    written = [store.add_call(call) for call in trace]
    assert store.list_calls(rollout_id) == written
    rows = stored_rows(shared_store_factory.url, rollout_id)
    ratio = stored_bytes(rows) / final_call_bytes(trace[-1])
    whole = sum(final_call_bytes(call) for call in trace) / final_call_bytes(trace[-1])
    assert ratio <= 1.5, f"stored {ratio:.2f}x the final call (whole copies would be {whole:.1f}x)"
    assert whole > 20  # what the old format stored: every call whole
    assert [row["prompt_base_seq"] for row in rows] == [None, *range(49)]
    assert [row["request_base_seq"] for row in rows] == [None, *range(49)]
    assert [row["prompt_len"] for row in rows] == [len(c.prompt_token_ids) for c in trace]
    assert all(row["request"] == "null" for row in rows[1:])  # the frame (tools...) stored once


def test_responses_calls_on_previous_response_id_grow_linearly(shared_store_factory: Any) -> None:
    """A Responses harness that sends only its new items with ``previous_response_id``: the gateway
    records the resolved earlier conversation under ``_harnessrl_previous_messages``, which grows with
    every call while ``input`` stays one item. Chained on ``input`` (the first history key found),
    every row held the whole earlier conversation in its frame: 60 calls of one rollout stored 11.9 MB
    where the same calls sending their whole ``input`` stored 1.9 MB."""
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    trace = [
        call.model_copy(
            update={
                "api": "responses",
                "request": {
                    "model": "m",
                    "input": call.request["messages"][-1:],
                    "previous_response_id": f"resp_{i}",
                    "_harnessrl_previous_messages": call.request["messages"][:-1],
                },
            }
        )
        for i, call in enumerate(agent_trace(rollout_id, 50, system=1500, observation=300, answer=60))
    ]
    written = [store.add_call(call) for call in trace]
    assert store.list_calls(rollout_id) == written
    assert [c.request for c in written] == [c.request for c in trace]
    rows = stored_rows(shared_store_factory.url, rollout_id)
    ratio = stored_bytes(rows) / final_call_bytes(trace[-1])
    # <= 2, not 1.5: a call's new item is in its own frame (with its own previous_response_id), and
    # again in the next call's resolved history: twice, once each, still linear.
    assert ratio <= 2.0, f"stored {ratio:.2f}x the final call"
    assert {row["request_key"] for row in rows} == {"_harnessrl_previous_messages"}


def test_interleaved_subagent_chains_are_each_stored_as_deltas(shared_store_factory: Any) -> None:
    """Two agents alternating in one rollout: each call is stored on its own agent's previous call."""
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    main = agent_trace(rollout_id, 6, system=200, observation=50, answer=10)
    sub = [
        c.model_copy(update={"prompt_token_ids": [7, *c.prompt_token_ids], "request": {**c.request, "x": 1}})
        for c in agent_trace(rollout_id, 6, system=150, observation=40, answer=8)
    ]
    written = [store.add_call(c) for pair in zip(main, sub, strict=True) for c in pair]
    assert store.list_calls(rollout_id) == written
    rows = stored_rows(shared_store_factory.url, rollout_id)
    assert [row["prompt_base_seq"] for row in rows] == [None, None, *range(10)]
    assert [row["request_base_seq"] for row in rows] == [None, None, *range(10)]


def test_a_retry_and_an_edit_take_the_longest_exact_base(shared_store_factory: Any) -> None:
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    trace = agent_trace(rollout_id, 4, system=100, observation=20, answer=5)
    written = [store.add_call(c) for c in trace]
    retry = store.add_call(
        trace[3].model_copy(update={"response_token_ids": [1], "response_logprobs": [-1.0]})
    )
    edited_request = {
        **trace[3].request,
        "messages": [*trace[3].request["messages"][:3], {"role": "user", "content": "?"}],
    }
    edited_prompt = list(trace[3].prompt_token_ids)
    edited_prompt[110] += 1  # inside call 1's prompt + response (100 + 5 + 20 tokens): bases 0 only
    edit = store.add_call(
        trace[3].model_copy(update={"prompt_token_ids": edited_prompt, "request": edited_request})
    )
    assert store.list_calls(rollout_id) == [*written, retry, edit]
    rows = stored_rows(shared_store_factory.url, rollout_id)
    # The retry repeats call 3's prompt: its tokens are stored on call 2, as call 3's were, its
    # request on call 3 (nothing new). The edit keeps call 0's 105 tokens, and the first 3
    # messages: more than call 0's whole request (2), so it takes the first 3 of call 1's 4.
    assert (rows[4]["prompt_base_seq"], rows[4]["request_base_seq"]) == (2, 3)
    assert (rows[4]["request"], rows[4]["request_items"], rows[4]["request_base_items"]) == ("null", "", None)
    assert (rows[5]["prompt_base_seq"], rows[5]["request_base_seq"], rows[5]["request_base_items"]) == (
        0,
        1,
        3,
    )
    assert len(rows[5]["prompt_token_ids"]) == 4 * (len(edited_prompt) - 105)
    assert rows[5]["request_items"].count("\n") == 0  # only the edited message is new


def test_an_edited_newest_message_is_stored_on_the_rest_of_the_call_before(shared_store_factory: Any) -> None:
    """Claude Code moves its cache_control marker to the newest message on every call, so each
    request repeats the one before except for its last message: stored on that request's other
    items, not whole (whole, a 50-call rollout stored O(calls x context) again)."""
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    trace = agent_trace(rollout_id, 50, system=200, observation=40, answer=10)
    marked = []
    for call in trace:
        messages = [dict(m) for m in call.request["messages"]]
        messages[-1]["cache_control"] = {"type": "ephemeral"}  # only on the newest message
        marked.append(call.model_copy(update={"request": {**call.request, "messages": messages}}))
    written = [store.add_call(c) for c in marked]
    assert store.list_calls(rollout_id) == written
    assert [c.request for c in store.list_calls(rollout_id)] == [c.request for c in marked]
    rows = stored_rows(shared_store_factory.url, rollout_id)
    assert [row["request_base_seq"] for row in rows] == [None, *range(49)]
    # Each takes all but the last of the previous request's items (that one lost its marker).
    assert [row["request_base_items"] for row in rows[1:]] == [
        len(c.request["messages"]) - 1 for c in marked[:-1]
    ]
    final = marked[-1]
    stored = sum(len(row["request_items"]) + len(row["request"]) for row in rows)
    assert stored < 2.5 * len(json.dumps(final.request))  # linear: each message about twice at most


def test_calls_from_rows_refuses_a_delta_without_its_base(shared_store_factory: Any) -> None:
    store = shared_store_factory()
    rollout_id = store.create_rollout().rollout_id
    first, second = (
        store.add_call(c) for c in agent_trace(rollout_id, 2, system=10, observation=3, answer=2)
    )
    rows = stored_rows(shared_store_factory.url, rollout_id)
    assert call_from_row(rows[0]) == first  # a self-contained row decodes alone
    with pytest.raises(HarnessRLError, match="base call 0"):
        call_from_row(rows[1])
    assert second.seq == 1


def test_a_shortened_history_is_not_stored_on_a_longer_one(store: Store) -> None:
    """Found by the property test: a request whose history is a strict prefix of an earlier one's
    (here: emptied) was stored on it, and read back with the earlier call's items."""
    rollout_id = store.create_rollout().rollout_id
    first = store.add_call(make_chat_call(rollout_id, [{"role": "user", "content": "hi"}], [1, 2, 3]))
    shorter = store.add_call(make_chat_call(rollout_id, [], [1, 2]))
    assert store.list_calls(rollout_id) == [first, shorter]


def make_chat_call(rollout_id: str, messages: list[Any], prompt: list[int]) -> Call:
    return Call(
        rollout_id=rollout_id,
        request={"model": "m", "messages": messages},
        prompt_token_ids=prompt,
        response_token_ids=[9],
        response_logprobs=[-0.5],
    )


def test_chain_cache_keeps_the_most_recently_written_rollouts_within_its_bound() -> None:
    def chains(size: int) -> AttemptChains:
        value = b"\0" * size
        return AttemptChains(0, 0, tokens=(Chain(None, value, (Link(size, 0),), size),))

    cache = ChainCache(max_bytes=100)
    cache.put({"a": chains(40), "b": chains(40)})
    cache.put({"a": chains(50)})  # replaced: counted once, and now the most recent
    assert cache.get("a") is not None and cache.get("b") is not None
    cache.put({"c": chains(30)})  # 120 bytes: the least recently written goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    cache.put({"d": chains(500)})  # larger than the bound: nothing is kept
    assert [cache.get(k) for k in "acd"] == [None, None, None]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"text": "é ☃\n\u0000", "n": [1, -2.5]}, {"text": "é ☃\n\u0000", "n": [1, -2.5]}),
        ({"big": 2**70}, {"big": 2**70}),  # past 64 bits: orjson refuses, json writes it
        ({"lone": "a\ud800"}, {"lone": "a\ud800"}),  # a lone surrogate: json escapes it
        ({1: "int key"}, {"1": "int key"}),  # json's reading of a non-string key
        ({"nan": math.nan, "inf": [math.inf]}, {"nan": None, "inf": [None]}),  # not JSON: null
        ({"nan": math.nan, "big": 2**70}, {"nan": None, "big": 2**70}),  # null on the json path too
    ],
)
def test_call_json_is_compact_json_that_reads_back(value: dict[Any, Any], expected: dict[str, Any]) -> None:
    text = dump_call_json(value)
    assert "\n" not in text.replace("\\n", "")  # one line: history items are stored one per line
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} written")) == expected


def test_encoded_items_are_taken_only_for_their_own_list() -> None:
    """``pack_call`` takes a caller's item texts (``EncodedItems``) for the very list they encode,
    and encodes the items itself for any other (a copy, another request, a different length)."""
    from harnessrl.store.chains import EncodedItems, split_request

    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": 1.5}],
    }
    plain = split_request(request)
    marked = ("A", "B")  # not the real texts: shows which were used
    assert split_request(request, EncodedItems(request["messages"], marked))[2] == marked
    for other in (EncodedItems(list(request["messages"]), marked), EncodedItems(request["messages"], ("A",))):
        assert split_request(request, other) == plain
