"""The pydantic models of the model APIs' request bodies (OpenAI chat and completions; the shared
sampling fields the Responses and Anthropic bodies build on).

They allow extra fields: harnesses send vendor fields (``drop_params``, ``metadata``, ``store``,
``user`` ...) that must be ignored, not rejected. The fields the store keeps in columns are typed to
what it can hold (``StoreInt``). The fields the gateway acts on take JSON's own types only
(``JsonInt``, ``JsonFloat``, ``StrictBool``): pydantic's lax mode read ``"max_tokens": true`` as
a one-token budget and ``"stream": "yes"`` as a stream. Reading and validating a body: ``bodies``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from harnessrl.errors import BadRequest
from harnessrl.gateway.json_input import INT64_MAX, INT64_MIN

#: An integer the store can hold (``step``, ``attempt``, ``seed``...); pydantic turns an integral
#: float (``1e19``) into an int, so the range is checked on the field as well as in the JSON.
StoreInt = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]

#: Most stop strings one request may set. Each sampled token is checked against every one of them on
#: the event loop: 40,000 (what the prompt-size cap lets through on a 32 k context) held it ~30 ms a
#: token, every other rollout's calls waiting. OpenAI takes 4.
MAX_STOP_STRINGS = 32


def _json_number(value: Any) -> Any:
    """A number as JSON has it: not a boolean or a string, which pydantic's lax mode converts."""
    if isinstance(value, bool | str):
        raise ValueError(f"must be a number, not {'a boolean' if isinstance(value, bool) else 'a string'}")
    return value


#: Numbers the gateway acts on (``max_tokens``, ``temperature``...); an integral float such as
#: ``16.0`` is still read as the integer 16.
JsonInt = Annotated[int, BeforeValidator(_json_number)]
JsonFloat = Annotated[float, BeforeValidator(_json_number)]


def _few_stops(stops: list[str]) -> list[str]:
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are supported, got {len(stops)}")
    return stops


#: A list of stop strings (chat's and completions' ``stop``, Messages' ``stop_sequences``).
StopList = Annotated[list[str], AfterValidator(_few_stops)]


class Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(Lenient):
    id: str | None = None
    type: str | None = "function"
    function: FunctionCall


class MessageIn(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any] | str] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(Lenient):
    include_usage: StrictBool | None = None


class OneChoice(Lenient):
    """``n``: a call is one answer (one sample of the policy; one recorded call)."""

    n: JsonInt | None = Field(default=None, ge=1)

    def check_n(self) -> None:
        if self.n not in (None, 1):
            raise BadRequest("only n=1 is supported: each call is one sample of the policy", param="n")


class SamplingFields(OneChoice):
    """Fields chat and legacy completions share."""

    model: str | None = None
    temperature: JsonFloat | None = Field(default=None, ge=0.0, le=2.0)
    top_p: JsonFloat | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: JsonInt | None = Field(default=None, ge=1)
    stop: str | StopList | None = None
    seed: Annotated[StoreInt, BeforeValidator(_json_number)] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


#: Names a client may not set in ``chat_template_kwargs``: what the gateway passes to the template
#: itself (``PolicyTokenizer.render_chat``; ``chat_template``/``tokenize`` vLLM refuses too), and the
#: functions templates call (jinja's default globals and ``tokenizer.compile_chat_template``'s), which
#: a value would shadow. Either way rendering would fail (a TypeError), not the template's choice.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "tools", "add_generation_prompt", "chat_template", "tokenize", "self"}
    | {"raise_exception", "strftime_now", "dict", "namespace", "range", "lipsum", "cycler", "joiner"}
)


class ChatTemplateKwargs(Lenient):
    """``chat_template_kwargs``: extra variables for the chat template (``enable_thinking``...).

    Any name a template may read is allowed, as vLLM allows it, except ``RESERVED_TEMPLATE_KWARGS``:
    the conversation, which only ``messages`` and ``tools`` may carry, and the template's functions.
    """

    @model_validator(mode="before")
    @classmethod
    def _no_reserved_names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            taken = sorted(RESERVED_TEMPLATE_KWARGS.intersection(data))
            if taken:
                raise ValueError(
                    f"{', '.join(taken)} cannot be set here: the gateway renders the template with its "
                    f"own (reserved: {', '.join(sorted(RESERVED_TEMPLATE_KWARGS))})"
                )
        return data

    def as_kwargs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _check_chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool's shape, checked where the chat template would fail on it (a name or a
    description that is not a string, parameters that are not an object); the dict itself goes on
    unchanged (the template renders it as sent). Tools of other types are the template's to read."""
    if tool.get("type", "function") != "function":
        return tool
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError("a function tool needs 'function', an object")
    if not isinstance(function.get("name"), str):
        raise ValueError("function.name must be a string")
    if function.get("description") is not None and not isinstance(function["description"], str):
        raise ValueError("function.description must be a string or null")
    if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
        raise ValueError("function.parameters must be an object or null")
    return tool


ChatTool = Annotated[dict[str, Any], AfterValidator(_check_chat_tool)]


class ChatTurn(OneChoice):
    """What a chat body says of the answer it wants: one new assistant turn after the whole
    conversation, rendered with the model's own template.

    vLLM's fields for how the conversation is rendered. The gateway always renders a new assistant
    turn after the whole conversation with the policy's own template: it accepts only the values
    that say so, and refuses the others rather than ignoring them as it ignores vendor fields. Teacher
    mode checks these alone (``teacher.chat``; the rest of its body is the upstream's to judge): an
    upstream that honoured them would answer a continuation, an echo or several choices, and the
    recorded call would not be the turn the harness was given.
    """

    add_generation_prompt: StrictBool | None = None
    continue_final_message: StrictBool | None = None
    chat_template: str | None = None
    echo: StrictBool | None = None  # vLLM's: the answer begins with the last message's text

    @field_validator("add_generation_prompt")
    @classmethod
    def _always_a_generation_prompt(cls, value: bool | None) -> bool | None:
        if value is False:
            raise ValueError("only true is supported: every call renders a new assistant turn")
        return value

    @field_validator("continue_final_message")
    @classmethod
    def _never_continued(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(
                "only false is supported: every call renders a new assistant turn after the last message"
            )
        return value

    @field_validator("echo")
    @classmethod
    def _never_echoed(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("only false is supported: the answer is the new assistant turn alone")
        return value

    @field_validator("chat_template")
    @classmethod
    def _policy_template_only(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("not supported: prompts are rendered with the policy's own chat template")
        return value


class ChatCompletionRequest(SamplingFields, ChatTurn):
    messages: list[MessageIn] = Field(min_length=1)
    max_completion_tokens: JsonInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: JsonInt | None = Field(default=None, ge=0, le=20)
    tools: list[ChatTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None  # vLLM's extension, e.g. enable_thinking
    # OpenAI's deprecated form of ``tools``. Ignored as an unknown field, the template never showed
    # the policy the functions the harness offered (it answered as if it had none): refused.
    functions: list[Any] | None = None

    @field_validator("functions")
    @classmethod
    def _tools_not_functions(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError(
                "not supported (OpenAI's deprecated form of tools): send each function as a tool, "
                '{"type": "function", "function": {...}}, in "tools"'
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _a_tool_choice_openai_takes(cls, value: Any, info: ValidationInfo) -> Any:
        """OpenAI's values only (a misspelled one was taken as "auto"): ``none``, ``auto``,
        ``required``, or ``{"type": "function", "function": {"name": N}}`` naming one of the tools;
        ``required`` and a named one need tools (``auto`` without tools is harmless: some SDKs send
        it). Accepted, not enforced: the policy samples freely."""
        if value is None or value in ("none", "auto"):
            return value
        if isinstance(value, str) and value != "required":
            raise ValueError(f"must be 'none', 'auto', 'required' or a named function, got {value!r}")
        tools = info.data.get("tools")
        if not tools:
            raise ValueError("is only allowed when tools are given")
        if isinstance(value, dict):
            function = value.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if value.get("type") != "function" or not isinstance(name, str):
                raise ValueError('a named choice is {"type": "function", "function": {"name": ...}}')
            if name not in {(t.get("function") or {}).get("name") for t in tools}:
                raise ValueError(f"names the function {name!r}, which is not among the tools")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def wants_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(SamplingFields):
    # Strict: ``true`` is not token 1 (pydantic's lax mode would read it so).
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: JsonInt | None = Field(default=None, ge=0, le=5)
    # Refused rather than ignored, as chat's ``echo``: the answer would read as something else (an
    # evaluation harness scoring the prompt's echoed logprobs got one new token and scored nothing).
    echo: StrictBool | None = None
    suffix: str | None = None

    @field_validator("echo")
    @classmethod
    def _never_echoed(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("only false is supported: the answer is the new text alone (no prompt logprobs)")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_insertion(cls, value: str | None) -> str | None:
        if value:
            raise ValueError(
                "not supported: the policy continues the prompt; it does not fill in before a suffix"
            )
        return value

    def single_prompt(self) -> str | list[int]:
        """The one prompt of this request (batches of one are unwrapped; larger batches are refused)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise BadRequest("only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise BadRequest("prompt is empty", param="prompt")
        return prompt  # type: ignore[return-value]
