"""In-process targets: the native engine (``native_engine``) and llama.cpp (``llama_cpp``) on a GGUF file.

Both expose the whole vocabulary, so their distributions are full rows of log-probabilities and two
of them over the same vocabulary give the exact KL. Scoring is one forward pass over prompt +
continuation (the native engine's ``LLMEngine.score``, llama.cpp's ``eval`` with ``logits_all``);
generation is greedy (temperature 0, no penalties). This is the one module of ``accuracy/`` that
imports an engine, each lazily, so re-pointing it at runner processes touches nothing else.

Engine settings come from the target's ``?key=value`` options: for the native engine any
``EngineConfig`` field (``dtype=float32&cpu_int4_matmul=false`` is the exact f32 path), for llama.cpp
``n_ctx``, ``n_threads``, ``n_batch``. Both engines follow the context rule of ``infer serve``
(``core/settings.py``): ``INFER_CONTEXT_LENGTH`` unless the target names its own (``max_model_len``,
``n_ctx``); the native engine stops at the model's trained context.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from core.settings import LocalSettings

from .divergence import log_softmax
from .target import Continuation, Dist, Piece, TargetError, TargetInfo, Vocab

# Sized for a comparison (a few sequences at a time), not for serving.
NATIVE_DEFAULTS = {"max_num_seqs": 16, "kv_cache_memory_bytes": 128 << 20}
LLAMACPP_OPTIONS = {"n_ctx": int, "n_threads": int, "n_batch": int}


def _cut_at_stop(pieces: list[Piece], stop: list[str] | None) -> list[Piece]:
    """The pieces before the first piece that completes a stop string."""
    if not stop:
        return pieces
    text = b""
    for i, piece in enumerate(pieces):
        text += piece.bytes
        if any(s.encode() in text for s in stop):
            return pieces[:i]
    return pieces


def _rows(logits: np.ndarray, start: int, n: int) -> np.ndarray:
    """The log-probability rows that predict tokens start+1 .. start+n (row i predicts token i+1)."""
    return log_softmax(logits[start - 1 : start - 1 + n])


class _EngineTarget:
    """What both engines share: prompt tokens, continuation ids, distributions from score rows."""

    info: TargetInfo
    vocab: Vocab

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _logits(self, ids: list[int]) -> np.ndarray:
        raise NotImplementedError

    def _continuation(self, prompt: str, ids: list[int], pieces: list[Piece], finish: str | None) -> Continuation:
        return Continuation(prompt, pieces, finish, ids, self.vocab, canonical=self._canonical(prompt, ids, pieces))

    def _canonical(self, prompt: str, ids: list[int], pieces: list[Piece]) -> list[bool]:
        """Position i: does prompt + the first i pieces, as text, encode to exactly these ids?"""
        out, text, expected = [], b"", list(ids)
        for piece in pieces:
            try:
                out.append(self._encode(prompt + text.decode("utf-8")) == expected)
            except UnicodeDecodeError:
                out.append(False)
            text += piece.bytes
            expected.append(piece.id)
        return out

    def _prompt_ids(self, continuation: Continuation) -> list[int]:
        if continuation.prompt_ids is not None and self.vocab.same_as(continuation.vocab):
            return continuation.prompt_ids
        return self._encode(continuation.prompt)

    def _continuation_ids(self, continuation: Continuation) -> list[int]:
        same = self.vocab.same_as(continuation.vocab)
        ids = []
        for position, piece in enumerate(continuation.pieces):
            token_id = piece.id if same and piece.id is not None else self.vocab.id_of(piece.bytes)
            if token_id is None:
                raise TargetError(f"{self.info.spec}: token {piece.bytes!r} at position {position} of A's answer is "
                                  "not one token of this vocabulary; the two targets must share a tokenizer")
            ids.append(token_id)
        return ids

    def score(self, continuation: Continuation, top_k: int) -> list[Dist | None]:
        prompt, ids = self._prompt_ids(continuation), self._continuation_ids(continuation)
        if not ids:
            return []
        rows = _rows(self._logits(prompt + ids), len(prompt), len(ids))
        return [Dist.from_row(row, self.vocab, top_k) for row in rows]


class NativeTarget(_EngineTarget):
    def __init__(self, info: TargetInfo, path: Path, options: dict[str, str]) -> None:
        from native_engine import EngineConfig, LLMEngine

        self.info = info
        config = {**NATIVE_DEFAULTS, "max_model_len": LocalSettings.from_env().context_length,
                  **_engine_options(EngineConfig, options, info.spec)}
        try:
            self.engine = LLMEngine.from_model(str(path), **config)
        except (ValueError, OSError, RuntimeError) as exc:
            raise TargetError(f"{info.spec}: the native engine could not load {path.name}: {exc}") from None
        tokenizer = self.engine.tokenizer
        self.vocab = Vocab([tokenizer.token_bytes(i) for i in range(self.engine.model_config.vocab_size)])
        info.details.update({"engine": "native", "dtype": str(self.engine.dtype).removeprefix("torch."),
                             "device": str(self.engine.device), **{k: config[k] for k in options}})

    def _encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text, add_bos=self.engine.tokenizer.add_bos_token)

    def _logits(self, ids: list[int]) -> np.ndarray:
        return self.engine.score(ids).double().cpu().numpy()

    def generate_greedy(self, prompts: list[str], max_tokens: int, top_k: int,
                        stop: list[str] | None = None) -> list[Continuation]:
        from native_engine import SamplingParams

        encoded = [self._encode(p) for p in prompts]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, stop=list(stop or []))
        try:
            outputs = self.engine.generate(encoded, params)
        except ValueError as exc:
            raise TargetError(f"{self.info.spec}: {exc}") from None
        tokenizer = self.engine.tokenizer
        return [self._continuation(prompt, ids, _cut_at_stop([Piece(t, tokenizer.token_bytes(t))
                                                              for t in out.outputs[0].token_ids], stop),
                                   out.outputs[0].finish_reason)
                for prompt, ids, out in zip(prompts, encoded, outputs, strict=True)]

    def close(self) -> None:
        self.engine = None


class LlamaCppTarget(_EngineTarget):
    def __init__(self, info: TargetInfo, path: Path, options: dict[str, str]) -> None:
        import llama_cpp

        self.info, self._llama_cpp = info, llama_cpp
        settings = {"n_ctx": LocalSettings.from_env().context_length, "n_threads": os.cpu_count() or 1, **_typed(LLAMACPP_OPTIONS, options, info.spec)}
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False,
                                       n_threads_batch=settings["n_threads"], **settings)
        except (ValueError, RuntimeError, OSError) as exc:
            raise TargetError(f"{info.spec}: llama.cpp could not load {path.name}: {exc}") from None
        model = self.llm._model
        self.vocab = Vocab([model.detokenize([i], special=True) for i in range(self.llm.n_vocab())])
        settings["n_ctx"] = self.llm.n_ctx()
        info.details.update({"engine": "llamacpp", "llama_cpp_python": llama_cpp.__version__, **settings})

    def _encode(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def _logits(self, ids: list[int]) -> np.ndarray:
        if len(ids) > self.llm.n_ctx():
            raise TargetError(f"{self.info.spec}: {len(ids)} tokens do not fit the context of {self.llm.n_ctx()} "
                              "(raise it with ?n_ctx=N)")
        self.llm.reset()
        self.llm.eval(ids)
        return np.array(self.llm.scores[: len(ids)], dtype=np.float64)

    def _greedy(self, ids: list[int], max_tokens: int, stop: list[str] | None) -> tuple[list[Piece], str]:
        if len(ids) + max_tokens > self.llm.n_ctx():
            raise TargetError(f"{self.info.spec}: the prompt ({len(ids)} tokens) and {max_tokens} new tokens do not "
                              f"fit the context of {self.llm.n_ctx()} (raise it with ?n_ctx=N)")
        self.llm.reset()
        pieces: list[Piece] = []
        for token in self.llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            if self._llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token):
                return pieces, "stop"
            pieces.append(Piece(int(token), self.vocab.pieces[token]))
            if len(_cut_at_stop(pieces, stop)) < len(pieces):
                return _cut_at_stop(pieces, stop), "stop"
            if len(pieces) == max_tokens:
                break
        return pieces, "length"

    def generate_greedy(self, prompts: list[str], max_tokens: int, top_k: int,
                        stop: list[str] | None = None) -> list[Continuation]:
        out = []
        for prompt in prompts:
            ids = self._encode(prompt)
            pieces, finish = self._greedy(ids, max_tokens, stop)
            out.append(self._continuation(prompt, ids, pieces, finish))
        return out

    def close(self) -> None:
        self.llm.close()


def _typed(fields: dict[str, type], options: dict[str, str], spec: str) -> dict:
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TargetError(f"{spec}: unknown option {unknown[0]!r}; this engine takes {', '.join(sorted(fields))}")
    return {k: _convert(fields[k], v, k, spec) for k, v in options.items()}


def _engine_options(config_cls, options: dict[str, str], spec: str) -> dict:
    fields = {f.name: f.type for f in dataclasses.fields(config_cls) if f.name != "model"}
    kinds = {name: bool if "bool" in str(t) else int if "int" in str(t) else float if "float" in str(t) else str
             for name, t in fields.items()}
    return _typed(kinds, options, spec)


def _convert(kind: type, value: str, name: str, spec: str):
    if kind is bool:
        if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise TargetError(f"{spec}: option {name} must be true or false, got {value!r}")
        return value.lower() in ("1", "true", "yes", "on")
    try:
        return kind(value)
    except ValueError:
        raise TargetError(f"{spec}: option {name} must be {kind.__name__}, got {value!r}") from None
