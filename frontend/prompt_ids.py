"""A local model's prompt as token ids, made once in the gateway process (vLLM's front end does the same
before its engine core): the model's template rendered (``chat_format``), dropping the oldest messages
to fit the context, then tokenized with its GGUF vocabulary (``gguf_io``, the tokenizer the native
engine loads too), the BOS token first when the vocabulary adds one and the template did not write it.

    vocab, longest = await vocabulary_of(gguf)      # read once per model file (off the event loop)
    prompt = tokenize_request(vocab, details, request, limit, longest)
    prompt.token_ids, prompt.dropped

Counting (``/v1/messages/count_tokens``) and generating use these same functions, so the count a key
is admitted with is the prompt the engine runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from core.options import check_prompt_bytes, check_token_ids
from frontend.chat_format import PromptSpec, render_request

__all__ = ["Prompt", "count_in_pieces", "encode", "prompt_spec", "same_ids_as_llama_cpp", "tokenize_request",
           "vocabulary", "vocabulary_of"]

PIECE_CHARS = 16 << 10  # text encoded per tokenizer call: a few milliseconds of holding the GIL


@dataclass
class Prompt:
    token_ids: list[int]
    dropped: int = 0  # messages left out to fit the context (Done.truncated_messages)


def vocabulary(path: str):
    """The GGUF file's tokenizer, read once per file (a second or so for a large vocabulary)."""
    return _entry(path)[0]


async def vocabulary_of(path: str) -> tuple:
    """The GGUF file's tokenizer and its longest entry in bytes; read off the event loop the first time."""
    reading = read_ahead(path)
    return _vocabs[path] if reading is None else await asyncio.shield(reading)


def read_ahead(path: str) -> None | asyncio.Future:
    """Start reading the file's tokenizer on a thread unless it is read or being read (a model's runner
    loads meanwhile); :func:`vocabulary_of` waits for it."""
    if path in _vocabs or path in _reading:
        return _reading.get(path)
    future = _reading[path] = asyncio.ensure_future(asyncio.to_thread(_entry, path))
    future.add_done_callback(lambda done: _reading.pop(path, None) and done.exception())
    return future


def _entry(path: str) -> tuple:
    from gguf_io.tokenizer import Tokenizer

    if path not in _vocabs:
        while len(_vocabs) >= _KEPT:
            _vocabs.pop(next(iter(_vocabs)))
        vocab = Tokenizer.from_gguf(path)
        _vocabs[path] = (vocab, max_token_bytes(vocab))
    return _vocabs[path]


_KEPT = 8
_vocabs: dict[str, tuple] = {}  # path -> (tokenizer, longest entry in bytes)
_reading: dict[str, asyncio.Future] = {}  # path -> its read on a thread, until it is done


def same_ids_as_llama_cpp(details) -> bool:
    """Whether this tokenizer reads the model's vocabulary (byte-level BPE, ``tokenizer.ggml.model`` "gpt2",
    with a pre-tokenizer it knows): then its ids are llama.cpp's (``tests/native_engine/loader/
    test_tokenizer.py``, ``scripts/check_token_ids.py``). SentencePiece vocabularies (Llama 2, Mistral,
    Gemma) it does not read."""
    from gguf_io.tokenizer import PRE_TOKENIZERS

    meta = details.gguf.metadata if details.gguf is not None and details.model_path is not None else {}
    pre = meta.get("tokenizer.ggml.pre")
    return meta.get("tokenizer.ggml.model") == "gpt2" and (not pre or pre in PRE_TOKENIZERS)


def prompt_spec(details, vocab) -> PromptSpec:
    bos = special_text(vocab, vocab.bos_token_id)
    eos = special_text(vocab, vocab.eos_token_ids[0] if vocab.eos_token_ids else None)
    return PromptSpec.from_details(details, bos_token=bos, eos_token=eos)


def special_text(vocab, token: int | None) -> str:
    return "" if token is None else vocab.decode([token], skip_special_tokens=False)


def adds_bos(vocab, spec: PromptSpec, text: str) -> bool:
    """llama.cpp's rule: BOS first when the vocabulary asks for it, unless the template wrote it."""
    return bool(vocab.add_bos_token) and not (spec.bos_token and text.startswith(spec.bos_token))


def encode(vocab, spec: PromptSpec, text: str) -> list[int]:
    return vocab.encode(text, add_bos=adds_bos(vocab, spec, text))


def tokenize_request(vocab, details, request, limit: int, longest: int) -> Prompt:
    """The request's prompt ids for a context of ``limit`` tokens (ids from the client are checked, kept);
    ``longest``: the vocabulary's longest entry in bytes (:func:`max_token_bytes`)."""
    if request.prompt_tokens is not None:
        return Prompt(check_token_ids(request.prompt_tokens, vocab.vocab_size))
    spec = prompt_spec(details, vocab)
    count = lambda text: limit + 1 if len(text) > limit * longest else len(encode(vocab, spec, text))  # noqa: E731
    prompt, dropped = render_request(spec, request, count, limit - 1)
    check_prompt_bytes(prompt, limit, longest)  # bounded work before tokenizing a huge prompt
    return Prompt(encode(vocab, spec, prompt), dropped)


def count_in_pieces(vocab, text: str) -> int:
    """``len(vocab.encode(text))``, encoding about ``PIECE_CHARS`` at a time, each piece ending at a line
    break followed by a non-space (where the pre-tokenizer splits anyway, so the count is the same)."""
    total, start = 0, 0
    while start < len(text):
        end = _piece_end(text, start)
        total += len(vocab.encode(text[start:end]))
        start = end
    return total


def _piece_end(text: str, start: int) -> int:
    if len(text) - start <= PIECE_CHARS:
        return len(text)
    at = start + PIECE_CHARS
    while True:
        found = text.find("\n", at)
        if found < 0 or found + 1 >= len(text):
            return len(text)
        if not text[found + 1].isspace():
            return found + 1
        at = found + 1


def max_token_bytes(vocab) -> int:
    """The longest vocabulary entry in bytes (a scan of the vocabulary: measure once per model)."""
    return max((len(vocab.token_bytes(i)) for i in range(vocab.vocab_size)), default=1)
