"""Where detokenizing sits (issue 27): in the runner (as built) or in the gateway, measured per token.

Over ~2,000 tokens of SmolLM2-135M Q4_1 text: (1) what detokenizing one token costs (llama.cpp's
``detokenize`` and our incremental UTF-8 and stop-string ``TextStream``, as the llama.cpp runner does;
and ``gguf_io``'s tokenizer, which a gateway would need for the native engine), and (2) what one
``Token`` message costs through ``adapters/engines/runner/protocol.py`` (msgspec encode + decode) with the text
and the token id vs with the token id alone. The runner's per-token work runs beside the gateway's
event loop; moving detokenizing into the gateway would put (1) on that one loop for every stream of
every model, to save the few bytes of text in (2).

    .venv/bin/python bench/runner_detokenize.py
"""

from __future__ import annotations

import statistics
import time

from core.base import Chunk
from frontend.textstream import TextStream
from adapters.engines.runner import protocol as p

TEXT = ("Once upon a time, in a lighthouse at the edge of the world, there lived a keeper who counted the "
        "waves. Every night he lit the lamp, wrote in his log, and listened to the sea. ") * 40


def per_token_us(fn, items, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(items)
        times.append((time.perf_counter() - t0) / len(items) * 1e6)
    return statistics.median(times)


def main() -> None:
    import llama_cpp

    from registry.realmodels import fetch_smollm2

    llm = llama_cpp.Llama(model_path=str(fetch_smollm2()), n_ctx=64, vocab_only=True, verbose=False)
    tokens = llm.tokenize(TEXT.encode(), add_bos=False)

    def llama_detok(ids):
        stream = TextStream(["<|im_end|>"])
        for t in ids:
            stream.feed(llm.detokenize([t], special=True))

    from gguf_io.gguf_file import open_gguf
    from gguf_io.tokenizer import tokenizer_from_gguf

    hf = tokenizer_from_gguf(open_gguf(str(fetch_smollm2())))

    def hf_detok(ids):
        stream = TextStream(["<|im_end|>"])
        for t in ids:
            stream.feed(hf.decode([t], skip_special_tokens=False).encode())

    chunks = [Chunk(llm.detokenize([t]).decode("utf-8", "replace"), [t]) for t in tokens]
    bare = [Chunk("", [t]) for t in tokens]

    def wire(items):
        for chunk in items:
            p.from_runner.decode(p.encoder.encode(p.Token(1, chunk)))

    rows = [("detokenize: llama.cpp + TextStream (runner)", per_token_us(llama_detok, tokens)),
            ("detokenize: gguf_io tokenizer + TextStream", per_token_us(hf_detok, tokens)),
            ("Token message with text + id: encode + decode", per_token_us(wire, chunks)),
            ("Token message with the id only: encode + decode", per_token_us(wire, bare))]
    print(f"{len(tokens)} tokens of SmolLM2-135M text, µs per token (median of 5)")
    for label, us in rows:
        print(f"  {label:50} {us:7.2f}")
    print(f"  text in the message costs {rows[2][1] - rows[3][1]:+.2f} µs/token; detokenizing in the gateway "
          f"would cost {min(rows[0][1], rows[1][1]):.2f} µs/token on its event loop")


if __name__ == "__main__":
    main()
