from hypothesis import given
from hypothesis import strategies as st

from native_engine.detokenizer import IncrementalDetokenizer


def _bytes_tokens(text: str, cut: int = 1) -> list[bytes]:
    raw = text.encode("utf-8")
    return [raw[i : i + cut] for i in range(0, len(raw), cut)]


def _run(pieces: list[bytes], stop=()) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(lambda i: pieces[i], stop)
    chunks = [detok.add(i) for i in range(len(pieces))]
    chunks.append(detok.flush())
    return chunks, detok


def test_multibyte_characters_are_never_split():
    chunks, _ = _run(_bytes_tokens("héllo 世界 🙂"))
    assert "".join(chunks) == "héllo 世界 🙂"
    assert all("\ufffd" not in c for c in chunks)


def test_stop_string_across_tokens_is_cut_and_never_shown():
    chunks, detok = _run([b"Hel", b"lo ##", b"#EN", b"D tail"], stop=["###END"])
    assert "".join(chunks) == "Hello "
    assert detok.stop_string == "###END"
    assert all("#" not in c for c in chunks)


def test_partial_stop_prefix_is_released_when_it_does_not_match():
    chunks, detok = _run([b"a #", b"# b"], stop=["###"])
    assert chunks[0] == "a "
    assert "".join(chunks) == "a ## b"
    assert detok.stop_string is None


@given(st.text(max_size=40), st.integers(1, 4))
def test_any_text_round_trips_without_stop_strings(text, cut):
    chunks, _ = _run(_bytes_tokens(text, cut))
    assert "".join(chunks) == text


@given(st.text(alphabet="ab#", max_size=30), st.sampled_from(["##", "a#b", "bbb"]))
def test_output_is_the_text_before_the_first_stop(text, stop):
    chunks, _ = _run(_bytes_tokens(text), stop=[stop])
    index = text.find(stop)
    assert "".join(chunks) == (text if index < 0 else text[:index])
