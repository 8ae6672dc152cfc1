"""An exact, faster ``encode`` for ASCII text: the pre-tokenizer in Python ``re``, a cache of piece BPE.

Encoding each model call's new prompt tail is the gateway's largest CPU item per call, and ~93% of
Hugging Face ``tokenizers``' time there is its pre-tokenizer: an onig regex ``Split`` (Qwen's runs at
~0.5 us per character). Agent traffic (code, shell output, JSON) is nearly all ASCII, and on ASCII
text the regex's Unicode classes reduce to small explicit ones that Python's ``re`` matches several
times faster. :class:`AsciiEncoder` encodes an ASCII text the way the tokenizer does, step by step:

1. split out the added tokens as HF does: those not ``normalized`` first (leftmost-longest), then the
   ``normalized`` ones in the text between (with an identity normalizer their patterns are their
   contents);
2. split what remains with the ASCII equivalent of each ``Split`` regex in turn (``Isolated``: every
   match is a piece, and so is each run of text between matches), or of the whole sequence at once
   where ``harnessrl.ascii_splits`` has one regex for it;
3. look each piece up in a bounded cache (piece -> IDs) and encode a text's misses in one HF call,
   through a tokenizer that shares the model and only maps bytes (``ByteLevel`` without its regex),
   so each piece gets exactly the BPE that HF gives it.

On agent traffic this costs ~0.11-0.17 us per character with the cache warm, ~0.17-0.25 while it
fills, against HF's ~0.35-0.5. A text whose pieces all miss costs about what HF does, so such texts
take this path too (and fill the cache) rather than going back to HF whole.

It is used only where it provably gives HF's IDs (:func:`unsupported_reason` lists the conditions),
the ASCII regexes come from a table keyed by the exact pattern strings (``harnessrl.ascii_splits``; no
general translator), and a self-check against HF on a corpus of tricky strings
(:func:`self_check_texts`), comparing pieces and IDs, turns it off with a warning if anything differs.
Everything else goes through HF as before.
"""

from __future__ import annotations

import json
import logging
import operator
import re
import threading
from collections.abc import Callable, Iterable
from itertools import chain, compress

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from harnessrl.ascii_splits import (
    ASCII_SPLITS,
    IsolatedSplit,
    SplitTable,
    ascii_split_patterns,
    split_patterns,
)

log = logging.getLogger(__name__)

# Normalizers that leave every ASCII string as it is (ASCII characters have no decompositions).
_ASCII_IDENTITY_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}
# Post-processors that add nothing when special tokens are not asked for (encode never asks).
_QUIET_POST_PROCESSORS = {"ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing"}
# Joins a text's missing pieces for one HF call: an added token of the piece encoder, so it splits
# them and marks the boundaries in the IDs. Not ASCII, so no piece (nor any piece's BPE) contains it.
_SEPARATOR = "\ue000"


def _state(component: object | None) -> dict | None:
    """A tokenizer component's JSON, as in tokenizer.json (without serializing the whole vocabulary)."""
    return None if component is None else json.loads(component.__getstate__())


def _only_types(component: dict | None, allowed: set[str], parts: str) -> bool:
    """Whether a tokenizer component is absent or of an ``allowed`` type; a ``Sequence`` if each of
    its ``parts`` (``"normalizers"``, ``"processors"``) is."""
    if component is None:
        return True
    if component["type"] == "Sequence":
        return all(_only_types(part, allowed, parts) for part in component[parts])
    return component["type"] in allowed


def unsupported_reason(tokenizer: Tokenizer, ascii_splits: SplitTable = ASCII_SPLITS) -> str | None:
    """Why the fast path cannot encode like ``tokenizer``, or None where it can.

    Supported: a BPE model without dropout; a normalizer that is the identity on ASCII (none, NFC,
    NFD, NFKC, NFKD, a sequence of them); a pre-tokenizer that is ``ByteLevel(use_regex=true,
    add_prefix_space=false)`` or a sequence of ``Split(Regex, Isolated, invert=false)`` ending in
    ``ByteLevel(add_prefix_space=false, use_regex=false)``, every regex in ``ascii_splits``; added
    tokens none of which strips or matches single words, special ones matched (``encode_special_tokens``
    off); no padding or truncation; a post-processor that adds nothing without special tokens.
    """
    model = tokenizer.model
    if not isinstance(model, models.BPE) or model.dropout is not None:
        return "the model is not BPE without dropout"
    if not _only_types(_state(tokenizer.normalizer), _ASCII_IDENTITY_NORMALIZERS, "normalizers"):
        return "the normalizer may change ASCII text"
    patterns = split_patterns(_state(tokenizer.pre_tokenizer))
    if isinstance(patterns, str):
        return patterns
    if ascii_split_patterns(patterns, ascii_splits) is None:
        unknown = next(p for p in patterns if p not in ascii_splits)
        return f"no ASCII equivalent known for the split regex {unknown!r}"
    added = tokenizer.get_added_tokens_decoder().values()
    if any(t.lstrip or t.rstrip or t.single_word or not t.content for t in added):
        return "an added token strips whitespace, matches single words only or is empty"
    if tokenizer.encode_special_tokens:
        return "special tokens are encoded as text"
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        return "padding or truncation is set"
    if not _only_types(_state(tokenizer.post_processor), _QUIET_POST_PROCESSORS, "processors"):
        return "the post-processor may add tokens"
    return None


# Where a wrong translation shows: contractions in any case, digit runs, whitespace runs before
# letters, newlines and the end, the characters Python's \s and onig's \s disagree on (\x1c-\x1f) inside
# space runs and next to punctuation, \x0b and \x0c, punctuation runs before newlines.
_TRICKY_TEXTS = (
    "", " ", "  ", "\n", "\r\n", "\r", "\t", "\x0b", "\x0c", "\x1c\x1d\x1e\x1f", "\x00\x01\x08\x0e\x7f",
    "I'LL", "I'll", "it'S", "'S", "'s", "''s", "'", "x'", "don't", "WE'RE we'Re", "'ve 'VE 'm 'M 'd 'D",
    "'t 'T 'll 'lL", "'sup 'Sx 'reed", "I'LLx it'Sok WE'REx they'VEx I'Mx he'Dx don'Tx 'Sup", "x'lLy'rEz",
    "12345678901", "a1b22c333d4444e55555", " 42", "3.14159", "1,000,000",
    "v2.0.1-rc3", "x123abc", "   leading", "trailing   ", "trailing \n", "a  b   c", "a \n b", "  \n\n  x",
    " \t\n\x0b\x0c\r x", "\x1c x \x1f\n", " \x1c\x1d", "a\x1cb \x1fc", "x    \x1c    y", "a  \x1d  b",
    "\x1e    \x1f\n    z", "!\x1c", "{\x1d}", "a\x1e!", "  \x0b  x", "  \x0c\n", "x\r\n\r\ny", "foo!!!\n\n",
    "end.)\r\n", "?!\n", " ...\n", "({[<>]});\n", " $HOME", "tab\tsep\tvalues\t\n", "  \r\n  \r\n", " \x0c\n",
    "\x0b\n", "a\x0b\x0cb", "a \x0bb", "\t\tindented", "\n\n\n", "x  \n", "x \n\n y", "  12  ab  '  ",
    "def f(x):\n    return x ** 2\n\n\n", '{"key": [1, 2.5, "v\\n"], "n": null}\n',
    "$ ls -la | grep '^d' > out.txt 2>&1", "https://example.com/a_b-c?d=e&f=g#h",
    "CamelCase snake_case kebab-case SCREAMING_CASE", "@decorator\n#comment\n", "\x00word \x7fword",
    "-word _word .word 'word", "a-b--c---d", "x\x00\x00y", "caf\x7f 1\x002",
)  # fmt: skip


def self_check_texts(added_patterns: Iterable[str]) -> list[str]:
    """ASCII strings where a wrong translation would show: the regexes' edge cases, each added token's
    text mid-word, repeated, cut short and next to the others."""
    texts = list(_TRICKY_TEXTS)
    patterns = sorted(set(added_patterns))
    by_prefix: dict[str, str] = {}
    for token in patterns:
        for end in range(1, len(token)):
            by_prefix.setdefault(token[:end], token)
    for token in patterns:  # overlapping tokens: which one wins ("<|im" + "_end|>" -> "<|im_end|>"?)
        for start in range(1, len(token)):
            other = by_prefix.get(token[start:])
            if other is not None:
                texts.append(token + other[len(token) - start :])
    for i, token in enumerate(patterns):
        following = patterns[(i + 1) % len(patterns)]
        texts += [
            f"ab{token}cd",
            f" {token} ",
            f"{token}{token}",
            f"{token}{following}",
            f"x {token[:-1]} {token[1:]}\n",
            f"\n{token}\n\n{following} 12",
        ]
    return texts


class AsciiEncoder:
    """``Tokenizer.encode(text, add_special_tokens=False).ids`` for short ASCII texts, faster.

    Build with :meth:`build`, which answers None where the tokenizer is not supported or the
    self-check fails. :meth:`encode` answers None for texts it does not take (non-ASCII, long).
    Thread-safe: lookups read the cache without a lock (a dict read is atomic), and a lock guards
    inserting and the cache's turnover, so concurrent encodes see whole entries and the bound holds.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        ascii_splits: SplitTable = ASCII_SPLITS,
        max_chars: int = 32_768,
        cache_size: int = 1 << 16,
    ):
        reason = unsupported_reason(tokenizer, ascii_splits)
        if reason is not None:
            raise ValueError(f"the ASCII fast path does not support this tokenizer: {reason}")
        self.max_chars = max_chars
        patterns = split_patterns(_state(tokenizer.pre_tokenizer))
        assert not isinstance(patterns, str)
        ascii_patterns = ascii_split_patterns(patterns, ascii_splits)
        assert ascii_patterns is not None
        self._splits: list[Callable[[str], list[str]]] = [IsolatedSplit(p) for p in ascii_patterns]
        self._added_rxs, self._added = self._added_tokens(tokenizer)
        # The piece encoder shares the model (no copy of the vocabulary) and does just the rest.
        self._pieces_tok = Tokenizer(tokenizer.model)
        self._pieces_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        self._pieces_tok.add_special_tokens([AddedToken(_SEPARATOR, special=True, normalized=False)])
        self._separator_id = self._pieces_tok.token_to_id(_SEPARATOR)
        self._encode_batch = getattr(self._pieces_tok, "encode_batch_fast", self._pieces_tok.encode_batch)
        # Two generations: a hit in the older one moves to the newer; when the newer is full it
        # becomes the older and the oldest is dropped. The added tokens are always present.
        self._generation_size = max(1, cache_size // 2)
        self._recent: dict[str, tuple[int, ...]] = dict(self._added)
        self._older: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _added_tokens(tokenizer: Tokenizer) -> tuple[list[re.Pattern[str]], dict[str, tuple[int, ...]]]:
        """The added-token splitters (non-normalized, then normalized) and each pattern's ID."""
        normalizer = tokenizer.normalizer
        raw: dict[str, int] = {}
        normalized: dict[str, int] = {}
        for token_id, token in sorted(tokenizer.get_added_tokens_decoder().items()):
            if token.normalized:
                pattern = normalizer.normalize_str(token.content) if normalizer is not None else token.content
                if pattern.isascii():
                    normalized[pattern] = token_id
            elif token.content.isascii():  # others never occur in ASCII text
                raw[token.content] = token_id
        rxs = []
        for table in (raw, normalized):
            if table:
                # Longest first: at each position the first alternative that matches is the longest
                # token, and scanning takes the leftmost: HF's leftmost-longest. Captured for re.split.
                words = sorted(table, key=len, reverse=True)
                rxs.append(re.compile("(" + "|".join(map(re.escape, words)) + ")"))
        # A token's text can never be an ordinary piece (pieces lie between tokens), so both share the
        # cache. Where a normalized pattern equals a raw token, the raw one is split out first.
        return rxs, {text: (token_id,) for text, token_id in chain(normalized.items(), raw.items())}

    @classmethod
    def build(
        cls,
        tokenizer: Tokenizer,
        *,
        name: str,
        ascii_splits: SplitTable = ASCII_SPLITS,
        max_chars: int = 32_768,
        cache_size: int = 1 << 16,
    ) -> AsciiEncoder | None:
        """The fast path for ``tokenizer``, or None where it is unsupported or fails its self-check.

        Never raises: anything unexpected in reading the tokenizer's parts (a ``tokenizers`` release
        that serializes them differently, say) leaves the tokenizer on HF, with a warning."""
        try:
            reason = unsupported_reason(tokenizer, ascii_splits)
            if reason is not None:
                log.debug("tokenizer %s encodes through HF only: %s", name, reason)
                return None
            encoder = cls(tokenizer, ascii_splits=ascii_splits, max_chars=max_chars, cache_size=cache_size)
            mismatch = encoder._self_check(tokenizer)
        except Exception as exc:  # noqa: BLE001 - the fast path is optional; HF is always right
            log.warning("tokenizer %s: the ASCII fast path is off, setting it up failed: %r", name, exc)
            return None
        if mismatch is not None:
            log.warning("tokenizer %s: the ASCII fast path is off, it %s", name, mismatch)
            return None
        encoder.clear_cache()
        return encoder

    def _self_check(self, tokenizer: Tokenizer) -> str | None:
        """How this encoder differs from ``tokenizer`` on :func:`self_check_texts`, or None.

        Pieces are compared as well as IDs: a wrong split often gives the same IDs on a given text
        (control characters merge with nothing) but not on others.
        """
        texts = self_check_texts(self._added)
        hf_split = tokenizer.pre_tokenizer.pre_tokenize_str
        encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        expected = encode_batch(texts, add_special_tokens=False)
        for text, want in zip(texts, expected, strict=True):
            if self.split(text) != [text[start:end] for _, (start, end) in hf_split(text)]:
                return f"splits {text!r} wrong"
            if self.encode(text) != want.ids:
                return f"encodes {text!r} wrong"
        return None

    @property
    def cached_pieces(self) -> int:
        """How many pieces the cache holds: at most ``cache_size`` (with the added tokens), more only
        where one text alone brings over half as many new pieces."""
        return len(self._recent) + len(self._older)

    def clear_cache(self) -> None:
        with self._lock:
            self._recent = dict(self._added)
            self._older = {}

    def encode(self, text: str) -> list[int] | None:
        """``text``'s IDs, or None where the text is not for this path (not ASCII, or too long)."""
        if len(text) >= self.max_chars or not text.isascii():
            return None
        pieces = self._pieces(text)
        found = list(map(self._recent.get, pieces))
        if None in found:
            found = self._fill_misses(pieces, found)
        return list(chain.from_iterable(found))  # type: ignore[arg-type]

    def _fill_misses(self, pieces: list[str], found: list[tuple[int, ...] | None]) -> list[tuple[int, ...]]:
        """``found`` with the pieces the newer cache generation lacks filled in: from the older one, or HF."""
        older = self._older
        learned: dict[str, tuple[int, ...]] = {}
        missing: list[str] = []
        for piece in dict.fromkeys(compress(pieces, map(operator.not_, found))):
            ids = older.get(piece)
            if ids is None:
                missing.append(piece)
            else:
                learned[piece] = ids
        if missing:
            learned.update(zip(missing, self._encode_pieces(missing), strict=True))
        self._remember(learned)
        return [learned[piece] if ids is None else ids for piece, ids in zip(pieces, found, strict=True)]

    def segments(self, text: str) -> list[str | int]:
        """ASCII ``text`` as the stretches between its added tokens (in its first split: those not
        ``normalized``, where there are any) and those tokens' IDs, in order. The tokenizer encodes
        each stretch on its own, so a stretch's IDs do not depend on what surrounds it."""
        if not self._added_rxs:
            return [text]
        added = self._added
        return [added[part][0] if i % 2 else part for i, part in enumerate(self._added_rxs[0].split(text))]

    def _pieces(self, text: str, level: int = 0) -> list[str]:
        """The text's pre-tokenized pieces, added tokens among them as their own pieces."""
        if level < len(self._added_rxs):
            out: list[str] = []
            # re.split alternates text and captured tokens: even indices text, odd ones tokens.
            for i, part in enumerate(self._added_rxs[level].split(text)):
                if i % 2:
                    out.append(part)
                elif part:
                    out += self._pieces(part, level + 1)
            return out
        return self.split(text)

    def split(self, text: str) -> list[str]:
        """What the tokenizer's pre-tokenizer splits ASCII ``text`` into (added tokens aside)."""
        pieces = [text]
        for split in self._splits:
            pieces = split(pieces[0]) if len(pieces) == 1 else [q for p in pieces for q in split(p)]
        return pieces

    def _encode_pieces(self, pieces: list[str]) -> list[tuple[int, ...]]:
        """Each piece's BPE, from one HF call (which releases the GIL) on the pieces joined."""
        ids = self._encode_batch([_SEPARATOR.join(pieces)], add_special_tokens=False)[0].ids
        out = []
        start = 0
        for _ in range(len(pieces) - 1):
            end = ids.index(self._separator_id, start)
            out.append(tuple(ids[start:end]))
            start = end + 1
        out.append(tuple(ids[start:]))
        return out

    def _remember(self, entries: dict[str, tuple[int, ...]]) -> None:
        with self._lock:
            if len(self._recent) + len(entries) > self._generation_size:
                self._older = self._recent
                self._recent = dict(self._added)
            self._recent.update(entries)
