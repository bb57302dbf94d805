"""How many tokens a request's prompt is, without generating (Anthropic's ``/v1/messages/count_tokens``).

A model of the local store: its prompt rendered by its own template (``frontend/chat_format``)
and counted with its GGUF vocabulary (``gguf_io``), as the engine will tokenize it (the BOS token
included when the vocabulary adds one). It reads the store only: no engine loads, nothing generates.
A remote backend or route: its configured tokenizer, else the byte estimate the ledger marks
``estimated`` for unreported usage (``frontend/token_count``). The work runs off the event loop,
and a long prompt is encoded in pieces (:func:`count_in_pieces`): the tokenizer holds the GIL while it
encodes, so one 10 MB call would stall the loop for seconds.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache

from core.base import GenerationRequest, LocalBackend
from frontend.chat_format import PromptSpec, render_request
from frontend.token_count import ByteEstimate, TokenCounter

from gateway.serving.router import Router

_LIMIT = 1 << 30  # count everything: nothing is dropped to fit
PIECE_CHARS = 16 << 10  # text encoded per tokenizer call: a few milliseconds of holding the GIL


async def prompt_tokens(router: Router, request: GenerationRequest) -> int:
    backend = router.resolve(request)
    if isinstance(backend, LocalBackend):
        details = backend.details(request.model)
        return await asyncio.to_thread(_local_count, details, request)
    counter: TokenCounter = getattr(backend, "counter", None) or ByteEstimate()  # a remote's configured tokenizer
    return counter.prompt_tokens(request)


def _local_count(details, request: GenerationRequest) -> int:
    if details.model_path is None:
        return ByteEstimate().prompt_tokens(request)
    vocab = _vocabulary(str(details.model_path))
    bos = _special_text(vocab, vocab.bos_token_id)
    eos = _special_text(vocab, vocab.eos_token_ids[0] if vocab.eos_token_ids else None)
    spec = PromptSpec.from_details(details, bos_token=bos, eos_token=eos)
    prompt, _ = render_request(spec, request, lambda text: 0, _LIMIT)  # nothing is dropped: no count needed
    add_bos = vocab.add_bos_token and not (bos and prompt.startswith(bos))
    return count_in_pieces(vocab, prompt) + (1 if add_bos and vocab.bos_token_id is not None else 0)


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


@lru_cache(maxsize=8)
def _vocabulary(path: str):
    from gguf_io.tokenizer import Tokenizer

    return Tokenizer.from_gguf(path)


def _special_text(vocab, token: int | None) -> str:
    return "" if token is None else vocab.decode([token], skip_special_tokens=False)
