"""A streamed Responses answer's text deltas of one engine read, joined into one event.

A read of the engine often holds several sampled tokens; sent one event per token, a Responses
stream costs an event (and its envelope) per token. ``joined_deltas`` joins each run of adjacent
text (or reasoning) deltas of one content part into one delta of their text and logprobs, as
OpenAI's own streams carry several tokens' text in one (``anthropic_blocks.joined_deltas`` does the
same for Messages).
"""

from __future__ import annotations

from typing import Any

#: The delta events ``joined_deltas`` joins when adjacent and of the same item and content part.
_TEXT_DELTAS = frozenset({"response.output_text.delta", "response.reasoning_text.delta"})


def joined_deltas(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payloads`` with each run of adjacent text (or reasoning) deltas of one content part as one
    delta of their joined text and logprobs (OpenAI's streams carry several tokens' text in one)."""
    out: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []  # the deltas joined into ``out[-1]``
    for payload in payloads:
        if run and payload["type"] in _TEXT_DELTAS:
            last = run[0]
            if (
                last["type"] == payload["type"]
                and last["item_id"] == payload["item_id"]
                and last["output_index"] == payload["output_index"]
                and last["content_index"] == payload["content_index"]
            ):
                run.append(payload)
                continue
        if len(run) > 1:
            out[-1] = _joined(run)
        run = [payload] if payload["type"] in _TEXT_DELTAS else []
        out.append(payload)
    if len(run) > 1:
        out[-1] = _joined(run)
    return out


def _joined(run: list[dict[str, Any]]) -> dict[str, Any]:
    joined = {**run[0], "delta": "".join(p["delta"] for p in run)}
    if "logprobs" in joined:
        joined["logprobs"] = [entry for p in run for entry in p["logprobs"]]
    return joined
