"""Detokenizer (C06) and stop-string hold-back (C05) on a real byte-level BPE tokenizer trained here."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from deployctl_runtime.server.detokenizer import IncrementalDetokenizer
from deployctl_runtime.server.stop_strings import StopStringMatcher

SAMPLE = "聪明 😊 ďábel"


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]
    )
    tok.train_from_iterator(["hello world, the quick brown fox jumps over the lazy dog"] * 50, trainer)
    return tok


def test_sample_really_splits_characters_across_tokens(bpe):
    ids = bpe.encode(SAMPLE).ids
    assert len(ids) > len(SAMPLE)  # multi-byte characters span several byte-level tokens
    assert "\ufffd" in bpe.decode(ids[:1])  # the first token alone is half a character


def test_one_token_at_a_time_never_emits_half_a_character(bpe):
    ids = bpe.encode(SAMPLE).ids
    detok = IncrementalDetokenizer(bpe)
    deltas = [detok.add([i]) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == SAMPLE == detok.text


@pytest.mark.parametrize("cut", range(1, 9))
def test_cut_after_n_tokens_stream_equals_full_decode(bpe, cut):
    """max_tokens 1..8: an unfinished tail is flushed the same way as a one-shot decode would show it."""
    ids = bpe.encode(SAMPLE).ids[:cut]
    detok = IncrementalDetokenizer(bpe)
    streamed = "".join(detok.add([i]) for i in ids)
    assert "\ufffd" not in streamed
    assert streamed + detok.flush() == bpe.decode(ids)


def test_prompt_context_and_special_tokens(bpe):
    prompt = bpe.encode("hello").ids
    ids = bpe.encode(" world 😊").ids + [bpe.token_to_id("<eos>")]
    detok = IncrementalDetokenizer(bpe, prompt)
    out = "".join(detok.add([i]) for i in ids) + detok.flush()
    assert out == " world 😊"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet="abcDEFGHIJ😊聪", max_size=40),
    stops=st.lists(st.text(alphabet="abcDEFGHIJ😊", min_size=1, max_size=7), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
)
def test_stop_matcher_releases_exactly_the_text_before_the_first_completed_stop(text, stops, cuts):
    bounds = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    m = StopStringMatcher(stops)
    released = []
    for p in pieces:
        released.append(m.feed(p))
        # nothing of a stop string ever goes out, even partially completed ones are held back
        joined = "".join(released)
        assert not any(s in joined for s in stops)
    released.append(m.flush())
    # the stop string that completes first (as if fed one character at a time) cuts the text at its start
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    expected = text[: min(hits)[1]] if hits else text
    assert "".join(released) == expected
    assert m.stopped == bool(hits)


@given(
    text=st.text(alphabet="abcDEFGHIJ😊聪", max_size=40),
    stops=st.lists(st.text(alphabet="abcDEFGHIJ😊", min_size=1, max_size=7), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
)
def test_include_stop_releases_the_text_through_the_first_completed_stop(text, stops, cuts):
    # vLLM's include_stop_str_in_output: the same stop wins, the text keeps it and nothing after it
    bounds = sorted({c for c in cuts if c <= len(text)} | {0, len(text)})
    m = StopStringMatcher(stops, include_stop=True)
    released = "".join(m.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])) + m.flush()
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    assert released == (text[: min(hits)[0]] if hits else text)


def test_stop_split_over_tokens_is_held_then_flushed_on_mismatch():
    m = StopStringMatcher(["DEFGHIJ"])
    assert m.feed("abcDEF") == "abc"
    assert m.feed("G") == ""
    assert m.feed("HX") == "DEFGHX"  # the match failed: held text flushed
    assert m.feed("DEFGHI") == ""
    assert m.feed("Jzz") == "" and m.stopped and m.matched == "DEFGHIJ"


@pytest.mark.parametrize("pieces", [["EDD"], ["ED", "D"], ["E", "D", "D"]])
def test_overlapping_stops_cut_the_same_whatever_the_token_boundaries(pieces):
    m = StopStringMatcher(["EDD", "D"])  # "D" completes first although "EDD" starts earlier
    assert "".join(m.feed(p) for p in pieces) + m.flush() == "E" and m.matched == "D"
