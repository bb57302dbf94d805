"""How many tokens a request's prompt is, without generating (Anthropic's ``/v1/messages/count_tokens``).

A model of the local store: its prompt rendered by its own template (``adapters/prompting/chat_format``)
and counted with its GGUF vocabulary (``gguf_io``), as the engine will tokenize it (the BOS token
included when the vocabulary adds one). It reads the store only: no engine loads, nothing generates.
A remote backend or route: its configured tokenizer, else the byte estimate the ledger marks
``estimated`` for unreported usage (``adapters/prompting/token_count``). The work runs off the event loop.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache

from adapters.core.base import GenerationRequest, LocalBackend
from adapters.prompting.chat_format import PromptSpec, render_request
from adapters.prompting.token_count import ByteEstimate, TokenCounter

from gateway.serving.router import Router

_LIMIT = 1 << 30  # count everything: nothing is dropped to fit


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
    prompt, _ = render_request(spec, request, lambda text: len(vocab.encode(text)), _LIMIT)
    return len(vocab.encode(prompt, add_bos=vocab.add_bos_token and not (bos and prompt.startswith(bos))))


@lru_cache(maxsize=8)
def _vocabulary(path: str):
    from gguf_io.tokenizer import Tokenizer

    return Tokenizer.from_gguf(path)


def _special_text(vocab, token: int | None) -> str:
    return "" if token is None else vocab.decode([token], skip_special_tokens=False)
