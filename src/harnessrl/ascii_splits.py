r"""The ASCII equivalents of known pre-tokenizer split regexes, for the ASCII fast path's ``re``.

Hugging Face ``tokenizers`` splits text with onig regexes written in Unicode classes (``\p{L}``,
``\p{N}``, ``\s``...). On ASCII text each class is a small explicit set, and Python's ``re`` (a
backtracking engine with the same leftmost-first alternation, greedy quantifiers and lookaheads) then
finds the same matches, several times faster. Each known pattern is translated once, by hand, in
:data:`ASCII_SPLITS`, keyed by its exact string in tokenizer.json: there is no general translator, and
a pattern not in the table keeps its tokenizer on HF. ``harnessrl.ascii_encoder`` checks every entry
against HF when it builds (and the tests do, on arbitrary ASCII text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# ASCII members of the Unicode classes the known patterns use. Onig's \s is Unicode White_Space, which
# in ASCII is tab to CR and space; Python's \s adds \x1c-\x1f, so it is never used here.
_S = r"\t\n\x0b\x0c\r "
_L = "A-Za-z"  # \p{L}; no ASCII character is in \p{M}
_N = "0-9"  # \p{N}
_PS = r"!-/:-@\[-`{-~"  # \p{P} and \p{S} together: all 32 ASCII punctuation characters
_CONTRACTION = "'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])"  # (?i:'s|'t|'re|'ve|'m|'ll|'d)


def _qwen_like(digits: str) -> str:
    return (
        rf"{_CONTRACTION}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{digits}| ?[^{_S}{_L}{_N}]+[\r\n]*"
        rf"|[{_S}]*[\r\n]+|[{_S}]+(?![^{_S}])|[{_S}]+"
    )


#: The regex ``ByteLevel(use_regex=True)`` splits with (GPT-2's).
BYTE_LEVEL_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# The patterns as in tokenizer.json (exact strings; the CR and LF in DeepSeek's third are literal).
QWEN2_SPLIT = (  # Qwen2 to Qwen3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN35_SPLIT = (  # Qwen3.5 and 3.6: marks join words
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT = (  # cl100k and Llama 3: digits in runs of up to three
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK_SPLITS = (  # DeepSeek V3: digits in runs of up to three, then CJK runs, then the rest
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)

#: Known split regexes -> their equivalent on ASCII text, or None where no ASCII character can match
#: (the split changes nothing). None of them matches empty text. A tuple key is a whole sequence of
#: splits as one regex: one pass of ``re`` instead of several.
SplitTable = Mapping[str | tuple[str, ...], str | None]

ASCII_SPLITS: SplitTable = {
    QWEN2_SPLIT: _qwen_like(""),
    QWEN35_SPLIT: _qwen_like(""),  # no ASCII character is a mark
    LLAMA3_SPLIT: _qwen_like("{1,3}"),
    # DeepSeek V3's splits one by one...
    DEEPSEEK_SPLITS[0]: f"[{_N}]{{1,3}}",
    DEEPSEEK_SPLITS[1]: None,
    DEEPSEEK_SPLITS[2]: (
        rf"[{_PS}][{_L}]+|[^\r\n{_L}{_PS}]?[{_L}]+| ?[{_PS}]+[\r\n]*|[{_S}]*[\r\n]+"
        rf"|[{_S}]+(?![^{_S}])|[{_S}]+"
    ),
    # ... and all three at once. Digits always match the first alternative, so no other match starts
    # on one; the rest is the third regex kept off digits: none consumes one, and the lookahead takes
    # a digit for the end of the text, as the third split sees each run between digits on its own.
    DEEPSEEK_SPLITS: (
        rf"[{_N}]{{1,3}}|[{_PS}][{_L}]+|[^\r\n{_N}{_L}{_PS}]?[{_L}]+| ?[{_PS}]+[\r\n]*|[{_S}]*[\r\n]+"
        rf"|[{_S}]+(?![^{_S}{_N}])|[{_S}]+"
    ),
    # GPT-2 and its descendants (SmolLM2), through ByteLevel(use_regex=True).
    BYTE_LEVEL_REGEX: (
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_S}{_L}{_N}]+|[{_S}]+(?![^{_S}])|[{_S}]+"
    ),
}


class IsolatedSplit:
    """HF's ``Split(pattern, behavior="isolated")`` on ASCII text, with the pattern's ASCII equivalent."""

    def __init__(self, ascii_pattern: str):
        self._matches = re.compile(ascii_pattern)
        self._with_gaps = re.compile(f"({ascii_pattern})")  # re.split keeps a captured match
        assert self._matches.groups == 0, "an ASCII split pattern must not capture (re.split, findall)"

    def __call__(self, text: str) -> list[str]:
        pieces = self._matches.findall(text)
        # Matches never overlap nor are empty, so if their lengths add up to the text's there are no
        # gaps (always, for the patterns that match every character: Qwen's, GPT-2's).
        if sum(map(len, pieces)) == len(text):
            return pieces
        return [p for p in self._with_gaps.split(text) if p]


def split_patterns(pre_tokenizer: dict | None) -> list[str] | str:
    """The split regexes of a supported pre-tokenizer, in order, or why it is not supported."""
    if pre_tokenizer is None:
        return "no pre-tokenizer"
    if pre_tokenizer["type"] == "ByteLevel":
        if pre_tokenizer.get("add_prefix_space") or not pre_tokenizer.get("use_regex", True):
            return "ByteLevel pre-tokenizer without its regex or with a prefix space"
        return [BYTE_LEVEL_REGEX]
    if pre_tokenizer["type"] != "Sequence" or not pre_tokenizer["pretokenizers"]:
        return f"pre-tokenizer {pre_tokenizer['type']}"
    *splits, last = pre_tokenizer["pretokenizers"]
    if last["type"] != "ByteLevel" or last.get("add_prefix_space") or last.get("use_regex", True):
        return "the pre-tokenizer sequence does not end in ByteLevel(add_prefix_space=false, use_regex=false)"
    patterns = []
    for split in splits:
        if split["type"] != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
            return f"pre-tokenizer {split['type']} {split.get('behavior', '')} in the sequence"
        regex = split["pattern"].get("Regex")
        if regex is None:
            return "a Split on a string"
        patterns.append(regex)
    return patterns


def ascii_split_patterns(patterns: list[str], table: SplitTable = ASCII_SPLITS) -> list[str] | None:
    """The ASCII regexes that split like ``patterns`` applied in turn (those that change nothing
    left out), or None where the table lacks one: the whole sequence as one regex where it has it."""
    sequence = tuple(patterns)
    if sequence in table:
        ascii_patterns = [table[sequence]]
    elif all(p in table for p in patterns):
        ascii_patterns = [table[p] for p in patterns]
    else:
        return None
    return [p for p in ascii_patterns if p is not None]
