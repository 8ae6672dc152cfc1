"""``glm45`` / ``glm47`` (GLM-4.5, 4.6, 4.7): tool calls as a name and key/value pairs of text.

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

GLM-4.5/4.6 put newlines between the parts, GLM-4.7 none; both are read here. The name and keys are
trimmed, a value is not (the template writes it bare, so its newlines are the value's), and each
value is typed by the request's schema as for Qwen3-Coder (``schema_values.coerce_value``, vLLM's rules).
Inside a value only ``</arg_value>`` is markup, so a value may hold ``</tool_call>`` (where vLLM
ends the call and drops the value).

A block that breaks the shape is content up to where it breaks, counted in ``malformed``, and
reading goes on from there as content; a block cut short is content. Where vLLM differs: it makes a
call of a truncated block, skips stray text between the pairs, and drops a call whose name is not
among the request's tools; here any well-formed call is a call (the harness answers an unknown tool
as it would for any parser).
"""

from __future__ import annotations

from harnessrl.gateway.parsers.tools.qwen_xml import TaggedBlockParser, find_value_end, match_tag, skip_space


class GlmToolParser(TaggedBlockParser):
    """``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``, streamed."""

    first_state = "name"  # then: args (the next pair or the end), key, value_open, value

    def _read_block(self) -> str | None:
        buffer = self._buffer
        while True:
            if self._state in ("name", "key"):
                angle = buffer.find("<", max(self._pos, self._seen))
                if angle < 0:
                    self._seen = len(buffer)  # a long name or key is scanned once
                    return None
                word = self._unit_until(angle).strip()
                # A name is one word (else this is prose that mentions the tag); a key is not empty.
                if not word or (self._state == "name" and len(word.split()) > 1):
                    return "broken"
                if self._state == "name":
                    self._calls.append((word, {}))
                    self._pos = angle
                    self._enter("args")
                    continue
                self._seen = angle  # "</arg_key>" may still be arriving: look on from its "<"
                tag = match_tag(buffer, angle, ("</arg_key>",))
                if tag == "":
                    return None
                if tag is None:
                    self._pos = angle
                    return "broken"
                self._key, self._pos = word, angle + len(tag)
                self._enter("value_open")
                continue
            if self._state == "value":
                end, self._seen = find_value_end(buffer, self._pos, self._seen, "</arg_value>")
                if end < 0:
                    return None
                self._calls[-1][1][self._key] = self._unit_until(end)  # a repeated key: the last wins
                self._pos = end + len("</arg_value>")
                self._enter("args")
                continue
            expected = ("<arg_value>",) if self._state == "value_open" else ("<arg_key>", self.close_tag)
            # Whitespace between tags is passed once (see ``QwenXmlToolParser``).
            self._pos = pos = skip_space(buffer, self._pos)
            tag = match_tag(buffer, pos, expected)
            if tag == "":
                return None
            if tag is None:
                return "broken"
            self._pos = pos + len(tag)
            if tag == self.close_tag:
                return "done"
            self._enter("key" if tag == "<arg_key>" else "value")
