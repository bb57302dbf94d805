"""A vLLM-shaped ``/v1/completions`` that answers ``prompt_logprobs`` (vLLM's extension) from a real
engine: the tiny model on our native engine. Each prompt token j >= 1 gets
``{str(id): {"logprob", "rank", "decoded_token"}}`` for the top-k at its position plus the token
itself; entry 0 is null; as vLLM's OpenAI server returns them. Runs on 127.0.0.1 in a thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from accuracy.divergence import log_softmax


class VLLMScoring:
    def __init__(self, gguf, model: str = "tiny") -> None:
        from native_engine import LLMEngine

        self.engine = LLMEngine.from_model(str(gguf), max_num_seqs=2, max_model_len=512, kv_cache_memory_bytes=8 << 20)
        self.model, self.bodies = model, []
        app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> VLLMScoring:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the vLLM-shaped server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        prompt = body["prompt"]
        tokenizer = self.engine.tokenizer
        ids = prompt if isinstance(prompt, list) else tokenizer.encode(prompt, add_bos=tokenizer.add_bos_token)
        rows = log_softmax(self.engine.score(ids).double().numpy())
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if body.get("prompt_logprobs") is not None:
            k = int(body["prompt_logprobs"])
            choice["prompt_logprobs"] = [None] + [self._entry(rows[j - 1], ids[j], k) for j in range(1, len(ids))]
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "model": self.model, "choices": [choice]})

    def _entry(self, row: np.ndarray, token: int, k: int) -> dict:
        order = np.argsort(-row)
        ranks = {int(t): r + 1 for r, t in enumerate(order)}
        wanted = [int(t) for t in order[:k]] + ([token] if ranks[token] > k else [])
        piece = self.engine.tokenizer.token_bytes
        return {str(t): {"logprob": float(row[t]), "rank": ranks[t], "decoded_token": piece(t).decode("utf-8", "replace")}
                for t in wanted}
