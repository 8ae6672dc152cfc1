"""A toy reward a tiny random model can learn in a few steps: for smoke tests and the end-to-end
learning test of the trainer (examples/tiny/train.toml, whose inline tasks ask for vowels), never for
claims about real models."""

from __future__ import annotations

from typing import Any


def vowel_share(inp: Any) -> float:
    """Reward: the share of the final answer's non-space characters that are vowels (0..1).

    Dense, with enough variance under a random policy for group-relative advantages, and trivially
    learnable — shifting probability toward tokens rich in vowels is paid at once — which is what an
    end-to-end "does the loop learn at all" check needs.
    """
    text = "".join(inp.final_answer.split())
    if not text:
        return 0.0
    return sum(ch in "aeiouAEIOU" for ch in text) / len(text)
