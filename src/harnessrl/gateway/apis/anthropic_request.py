"""What an Anthropic Messages request is: the fields the gateway reads and checks (``MessagesRequest``,
and ``CountTokensRequest`` for ``/v1/messages/count_tokens``). Unknown fields are accepted and ignored.

Shared by the policy's handler (``apis.anthropic``) and teacher mode (``gateway.teacher``); how a
request becomes the internal conversation is ``anthropic_convert``'s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, ValidationInfo, field_validator

from harnessrl.gateway.apis.anthropic_convert import ThinkingParam
from harnessrl.gateway.body_models import JsonFloat, JsonInt, Lenient, SamplingFields, StopList


class MessageParam(Lenient):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(Lenient):
    """``/v1/messages/count_tokens``: the prompt-shaping fields of a Messages request."""

    model: str | None = None
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: ThinkingParam | None = None

    @field_validator("tool_choice")
    @classmethod
    def _a_tool_choice_anthropic_takes(cls, value: Any, info: ValidationInfo) -> Any:
        """Anthropic's values only (a misspelled one was taken as ``auto``, so a ``none`` misspelled
        still parsed tool calls): ``{"type": "auto" | "any" | "tool" | "none"}``; ``any`` and ``tool``
        need tools, ``tool`` a ``name`` among them. Accepted, not enforced: the policy samples freely."""
        if value is None:
            return value
        kind = value.get("type")
        if kind not in ("auto", "any", "tool", "none"):
            raise ValueError(f"type must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
        if kind in ("auto", "none"):
            return value
        tools = info.data.get("tools")
        if not tools:
            raise ValueError(f"{kind!r} is only allowed when tools are given")
        if kind == "tool":
            name = value.get("name")
            if not isinstance(name, str):
                raise ValueError("a 'tool' choice needs 'name', a string")
            if name not in {t.get("name") for t in tools if isinstance(t, dict)}:
                raise ValueError(f"names the tool {name!r}, which is not among the tools")
        return value


class MessagesRequest(CountTokensRequest, SamplingFields):
    """``/v1/messages``. Unknown fields (``metadata``, ``context_management``, ``output_config``,
    ``service_tier``, ``container`` ...) are accepted and ignored."""

    max_tokens: JsonInt = Field(ge=1)  # type: ignore[assignment]  # required by Anthropic's API
    temperature: JsonFloat | None = Field(default=None, ge=0.0, le=1.0)
    top_p: JsonFloat | None = Field(default=None, gt=0.0, le=1.0)
    top_k: JsonInt | None = Field(default=None, ge=0)  # accepted; the engines sample with top_p only
    stop_sequences: StopList | None = None  # at most ``MAX_STOP_STRINGS``
    stream: StrictBool | None = False

    def stop_strings(self) -> list[str]:
        return [s for s in self.stop_sequences or [] if s]

    @property
    def wants_tool_calls(self) -> bool:
        return bool(self.tools) and (self.tool_choice or {}).get("type") != "none"
