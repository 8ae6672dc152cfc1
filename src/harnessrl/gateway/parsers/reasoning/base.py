"""What a reasoning parser returns and the protocols it meets: ``ReasoningText`` / ``ContentText``
pieces, ``ReasoningParser`` (one per answer) and ``ReasoningParserFactory`` (a family's class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ReasoningText:
    text: str


@dataclass(frozen=True)
class ContentText:
    text: str


ReasoningEvent = ReasoningText | ContentText


class ReasoningParser(Protocol):
    def feed(self, text: str) -> list[ReasoningEvent]: ...

    def finish(self) -> list[ReasoningEvent]: ...

    @property
    def in_reasoning(self) -> bool:
        """Inside a reasoning block now (what the text fed so far ends in): counts reasoning tokens."""
        ...


class ReasoningParserFactory(Protocol):
    """A family's parser class: one parser per answer, and whether a prompt opened the block."""

    def __call__(self, starts_in_reasoning: bool = False) -> ReasoningParser: ...

    def prompt_opens_reasoning(self, prompt_tail: str) -> bool: ...
