"""How many tokens a request's prompt is, without generating (Anthropic's ``/v1/messages/count_tokens``).

A model of the local store: its prompt rendered by its own template and counted with its GGUF
vocabulary by ``frontend/prompt_ids``, the rule the gateway tokenizes a local model's prompt with
before a runner generates (the BOS token included when the vocabulary adds one). It reads the store
only: no engine loads, nothing generates. A remote backend or route: its configured tokenizer, else
the byte estimate the ledger marks ``estimated`` for unreported usage (``frontend/token_count``). The
work runs off the event loop, and a long prompt is encoded in pieces (``count_in_pieces``): the
tokenizer holds the GIL while it encodes, so one 10 MB call would stall the loop for seconds.
"""

from __future__ import annotations

import asyncio

from core.base import GenerationRequest, LocalBackend
from frontend.chat_format import render_request
from frontend.prompt_ids import adds_bos, count_in_pieces, prompt_spec, vocabulary
from frontend.token_count import ByteEstimate, TokenCounter

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
    vocab = vocabulary(str(details.model_path))
    spec = prompt_spec(details, vocab)
    prompt, _ = render_request(spec, request, lambda text: 0, _LIMIT)  # nothing is dropped: no count needed
    bos = 1 if adds_bos(vocab, spec, prompt) and vocab.bos_token_id is not None else 0
    return count_in_pieces(vocab, prompt) + bos
