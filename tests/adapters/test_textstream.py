"""Incremental text: UTF-8 split across tokens, stop strings across tokens, nothing leaks past a stop."""

from __future__ import annotations

from hypothesis import given, strategies as st

from frontend.textstream import TextStream


def run(pieces: list[bytes], stop=()) -> tuple[str, bool]:
    ts = TextStream(stop)
    out = ""
    for piece in pieces:
        out += ts.feed(piece)
        if ts.stopped:
            break
    return out + ts.flush(), ts.stopped


def test_multibyte_character_split_over_tokens_is_not_mangled():
    data = "héllo 世界".encode()
    pieces = [data[i:i + 1] for i in range(len(data))]
    ts = TextStream()
    shown = [ts.feed(p) for p in pieces]
    assert "".join(shown) + ts.flush() == "héllo 世界"
    assert "\ufffd" not in "".join(shown)


def test_stop_string_spanning_tokens_is_cut_and_not_shown():
    assert run([b"Hello", b" <|im", b"_end|>", b" more"], stop=["<|im_end|>"]) == ("Hello ", True)


def test_text_that_only_looks_like_a_stop_prefix_is_released():
    ts = TextStream(["STOP"])
    assert ts.feed(b"ab ST") == "ab "  # "ST" held back
    assert ts.feed(b"ay") == "STay"
    assert not ts.stopped


def test_earliest_of_several_stops_wins():
    assert run([b"one two three"], stop=["three", "two"]) == ("one ", True)


@given(st.text(max_size=40), st.lists(st.integers(1, 5), max_size=20))
def test_any_split_gives_the_same_text_without_stops(text, sizes):
    data, pieces, i = text.encode(), [], 0
    for n in sizes:
        pieces.append(data[i:i + n])
        i += n
    pieces.append(data[i:])
    assert run(pieces) == (text, False)


@given(st.text(alphabet="abcX", max_size=30), st.text(alphabet="abcX", min_size=1, max_size=3))
def test_output_never_contains_the_stop_and_is_a_prefix(text, stop):
    data = text.encode()
    out, stopped = run([data[i:i + 1] for i in range(len(data))], stop=[stop])
    assert stop not in out
    assert text.startswith(out)
    assert stopped == (stop in text)
