"""``kimi_k2`` (Kimi K2, K2-Instruct, K2-Thinking): calls in a ``<|tool_calls_section_begin|>`` section.

::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    {"city": "Tokyo"}<|tool_call_end|><|tool_calls_section_end|>

The header before ``<|tool_call_argument_begin|>`` is Kimi's own call id, ``[functions.]NAME:N``;
it is kept as the call's id (as vLLM does) in every API, Messages included, because Kimi's chat
template writes the ids of past calls back into the prompt in that shape. The section is the unit,
as for DeepSeek (``SectionToolParser``): every call in it parses, or the whole section stays text
and counts in ``malformed`` — vLLM keeps a truncated call's partial arguments as a call instead.
"""

from __future__ import annotations

import re

from harnessrl.gateway.parsers.tools.base import ToolCall
from harnessrl.gateway.parsers.tools.deepseek import SectionToolParser, call_from_arguments_text

_HEADER = re.compile(r"\s*((?:functions\.)?([^\s:]+):\d+)\s*")


class KimiK2ToolParser(SectionToolParser):
    """``<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>ARGS<|tool_call_end|>``."""

    section_begin = "<|tool_calls_section_begin|>"
    section_end = "<|tool_calls_section_end|>"
    call_begin = "<|tool_call_begin|>"
    call_end = "<|tool_call_end|>"
    argument_begin = "<|tool_call_argument_begin|>"

    def _parse_call(self, inner: str) -> ToolCall | None:
        header, sep, arguments = inner.partition(self.argument_begin)
        match = _HEADER.fullmatch(header)
        if not sep or match is None:
            return None
        call = call_from_arguments_text(match.group(2), arguments)
        if call is None:
            return None
        return ToolCall(call.name, call.arguments, id=match.group(1), family_id=True)
