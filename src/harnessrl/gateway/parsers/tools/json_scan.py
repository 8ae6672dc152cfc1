"""Where a JSON value the model writes inline ends, found over text that arrives in pieces.

Formats that put a call's JSON in the answer without a closing tag (Llama's ``{"name": ...}``,
Mistral's ``[TOOL_CALLS][...]``) need to know where the value ends before they can parse it, and a
streamed answer gives the text a few characters at a time. ``JsonValueScanner`` keeps its place, so
each character is looked at once however the text was split.
"""

from __future__ import annotations

import re

_JSON_SPECIAL = re.compile(r'[{}\[\]"]')
_STRING_SPECIAL = re.compile(r'["\\]')


class JsonValueScanner:
    """Finds where a JSON object or array that starts at ``text[0]`` ends, over a growing text.

    Brackets are counted outside strings (``{``/``[`` alike; the JSON parser checks the pairing
    afterwards), so the end is the same however the text was split, and each character is looked at
    once across calls.
    """

    def __init__(self) -> None:
        self._pos = 0
        self._depth = 0
        self._in_string = False

    def set_aside(self) -> int:
        """How much of the text is scanned and may be moved out of it (a long value streamed in
        small pieces is then kept as its pieces, not copied whole with each); the next text passed
        to ``end`` starts there."""
        scanned, self._pos = self._pos, 0
        return scanned

    def end(self, text: str) -> int | None:
        """Index just past the closing bracket, or None while the value is still open."""
        pos = self._pos
        while True:
            if self._in_string:
                match = _STRING_SPECIAL.search(text, pos)
                if match is None:
                    self._pos = len(text)
                    return None
                if match.group() == "\\":
                    if match.end() >= len(text):  # the escaped character has not arrived
                        self._pos = match.start()
                        return None
                    pos = match.end() + 1
                    continue
                self._in_string = False
                pos = match.end()
                continue
            match = _JSON_SPECIAL.search(text, pos)
            if match is None:
                self._pos = len(text)
                return None
            char, pos = match.group(), match.end()
            if char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            else:
                self._depth -= 1
                if self._depth <= 0:
                    self._pos = pos
                    return pos
