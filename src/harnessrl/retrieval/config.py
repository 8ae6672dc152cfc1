"""``[retrieval]``: the corpus a run's harnesses may search, and the limits on searching it.

The retriever runs inside the gateway process (``retrieval.route``), so a sandboxed harness reaches it
through the one socket it already has; nothing here opens a port. Documented in docs/retrieval.md.
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator

from harnessrl.config import Section


class RetrievalConfig(Section):
    corpus: str = Field(
        min_length=1,
        description="JSONL corpus: one passage a line, {id, title, text} or Search-R1's {id, contents}",
    )
    cache_dir: str | None = Field(
        default=None,
        description="where built indexes are kept, one folder per corpus content hash "
        "(default: $HARNESSRL_CACHE_DIR/retrieval, else ~/.cache/harnessrl/retrieval)",
    )
    top_k: int = Field(default=3, ge=1, le=50, description="passages a search returns unless it asks")
    max_top_k: int = Field(default=10, ge=1, le=100, description="the most passages one search may ask for")
    max_passage_chars: int = Field(
        default=1200,
        ge=64,
        description="a returned passage's title and text are each cut to this many characters",
    )
    max_query_chars: int = Field(
        default=1000, ge=1, le=100_000, description="a longer query is refused (413) before any work"
    )
    max_query_terms: int = Field(
        default=32, ge=1, le=1024, description="words of a query that are searched (the rest are ignored)"
    )
    rate_per_s: float = Field(
        default=20.0, gt=0, description="searches per second one rollout may make on average (token bucket)"
    )
    burst: int = Field(default=40, ge=1, description="searches one rollout may make at once before 429s")
    max_searches_per_rollout: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="searches one rollout attempt may make in all; past it a 409 tool error, nothing "
        "recorded (each search is stored with its passages: up to ~25 KB at the default limits)",
    )

    @field_validator("corpus", "cache_dir")
    @classmethod
    def _expand_home(cls, value: str | None) -> str | None:
        # "~/..." is the user's home, as a shell reads it: unexpanded, the index was built into a
        # folder literally named "~" under the working directory.
        return None if value is None else os.path.expanduser(value)

    @model_validator(mode="after")
    def _check(self) -> RetrievalConfig:
        if self.top_k > self.max_top_k:  # else every search that does not ask for a number is a 400
            raise ValueError(
                f"retrieval.top_k ({self.top_k}) must not exceed retrieval.max_top_k ({self.max_top_k})"
            )
        return self
