"""The engine: requests in, one continuous-batching step at a time, outputs streamed out.

With `async_scheduling` (the default on CUDA), a decode-only step's successor is scheduled and launched before
the step's sampled ids reach the host (`Scheduler.schedule_ahead`), so the host's work for step N+1 (schedule,
inputs, sampler metadata, launches) and for step N's outputs (detokenizing, stop checks) overlaps step N+1 on
the device instead of leaving it idle. `step()` still returns one step's outputs per call: those of the step it
collects, while the next one may already run."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field, replace

import torch

from . import platform
from .block_manager import BlockManager
from .kv_transfer import KVTransfer
from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .distributed.parallel_state import default_threads, start_engine_group, stop_engine_group
from .model_loading import build_runner, read_checkpoint
from .model_runner import bytes_per_token
from .output import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from .lora.request import LoRARequest
from .sampling_params import SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .model_runner import LaunchedStep
from .sequence import Sequence, SequenceStatus
from .spec_decode import build as spec_build
from .structured_output import StructuredOutputManager

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    detokenizers: dict[int, IncrementalDetokenizer] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    num_cached_tokens: int = 0


@dataclass(slots=True)
class _InFlight:
    """A launched step the engine has not collected yet."""

    out: SchedulerOutput
    launched: LaunchedStep
    started: float
    speculated: bool = False  # launched after the speculator planned and proposed


class LLMEngine:
    def __init__(self, config: EngineConfig, group=None) -> None:
        """`group`: a `TensorParallelGroup` of `config.tensor_parallel_size` ranks to run on (tests share one
        across engines); without it an engine with more than one rank starts its own (see `config.py`)."""
        self.config = config
        self.device = platform.resolve_device(config.device)
        if config.num_threads or (config.tensor_parallel_size > 1 and self.device.type == "cpu"):
            torch.set_num_threads(config.num_threads or default_threads(config.tensor_parallel_size))
        checkpoint = read_checkpoint(config, self.device)
        self.model_config, self.dtype, self.tokenizer = checkpoint.model_config, checkpoint.dtype, checkpoint.tokenizer
        self.max_model_len = checkpoint.max_model_len
        spec = config.speculative_config
        with platform.loading_threads(self.device):
            draft = spec_build.load_draft(spec, config, self.device, self.dtype, self.model_config.vocab_size)
        self.tp, self._owns_group = start_engine_group(config, self.device, group)
        try:
            self.model_runner = build_runner(config, checkpoint, self.device, self.tp, draft)
        except BaseException:
            self.close()
            raise
        self.model_runner.structured = StructuredOutputManager(self.tokenizer, self.model_config.vocab_size,
                                                               self.device)
        blocks = BlockManager(self.model_runner.num_kvcache_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, blocks, self.model_config.eos_token_ids, max_model_len=self.max_model_len)
        self.kv_transfer = KVTransfer(config.block_size)
        self.requests: dict[str, _Request] = {}
        # scheduling ahead feeds a step's input ids from the device; a group's other ranks take them from the plan
        ahead = self.device.type == "cuda" if config.async_scheduling is None else config.async_scheduling
        self.async_scheduling = ahead and self.tp is None
        self._inflight: _InFlight | None = None
        self.speculator = spec_build.speculator(spec, self, draft) if spec else None
        stats = self.stats()
        log.info("native engine: %s on %s%s, KV cache %d blocks x %d tokens = %d tokens at %d bytes/token",
                 self.dtype, self.device, f" x {config.tensor_parallel_size} ranks" if self.tp else "",
                 stats["num_kvcache_blocks"], config.block_size, stats["kv_capacity_tokens"],
                 stats["kv_bytes_per_token"])

    @classmethod
    def from_model(cls, model: str, **kwargs) -> LLMEngine:
        """`LLMEngine.from_model(path, max_num_seqs=16, ...)`: keyword arguments are `EngineConfig` fields."""
        return cls(EngineConfig(model=str(model), **kwargs))

    def close(self) -> None:
        """Ends the ranks of a tensor-parallel group (a shared group only unloads the model); idempotent."""
        tp, self.tp = getattr(self, "tp", None), None
        if tp is not None:
            stop_engine_group(tp, self._owns_group)

    # -- requests -----------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    priority: int = 0, arrival_time: float | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        """`lora_request`: the adapter the request runs through (the engine needs `max_loras` > 0)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        if self.tp is not None:
            self.tp.check()
        params = params or SamplingParams()
        token_ids = self._encode(prompt)
        self._check_prompt(token_ids, params)
        if lora_request is not None and self.config.lora_slots == 0:
            raise ValueError(f"LoRA adapter {lora_request.lora_name!r} asked of an engine without LoRA slots "
                             "(max_loras=0, or split over ranks)")
        if lora_request is not None:
            self.model_runner.lora.check(lora_request)  # read on first use; a bad adapter fails this request only
        self.model_runner.structured.validate(params)
        if params.speculative:
            self.enable_speculation()
        self._load_remote_kv(token_ids, params.kv_transfer_params)
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        seq = Sequence(token_ids, params, request_id=request_id, arrival_time=arrival, priority=priority,
                       block_size=self.config.block_size, lora_request=lora_request)
        self.scheduler.add(seq)
        request = _Request(request_id, token_ids, params, RequestMetrics(arrival))
        self.requests[request_id] = request
        self._detokenizer(request, seq)

    def _load_remote_kv(self, token_ids: list[int], kv_params: dict | None) -> None:
        """A decode leg: the prefill engine's blocks become prefix-cache blocks of this prompt (kv_transfer.py)."""
        if kv_params and kv_params.get("do_remote_prefill") and self.tp is None:
            self.kv_transfer.load(self.model_runner.kv_cache, self.scheduler.block_manager, token_ids, kv_params)

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_bos=self.tokenizer.add_bos_token)
        return list(prompt)

    def _check_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens but the context window is "
                             f"{self.max_model_len}; shorten the prompt")
        bad = [t for t in token_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.model_config.vocab_size})")

    def _detokenizer(self, request: _Request, seq: Sequence) -> IncrementalDetokenizer:
        if seq.sample_index not in request.detokenizers:
            piece = functools.partial(self._piece, skip_special=request.params.skip_special_tokens)
            request.detokenizers[seq.sample_index] = IncrementalDetokenizer(piece, request.params.stop)
        return request.detokenizers[seq.sample_index]

    def _piece(self, token_id: int, skip_special: bool) -> bytes:
        if skip_special and self.tokenizer.is_special(token_id):
            return b""
        return self.tokenizer.token_bytes(token_id)

    def abort(self, request_id: str) -> None:
        for seq in self.scheduler.abort(request_id):
            self.model_runner.release(seq)
            if self.speculator is not None:
                self.speculator.release(seq)
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None

    # -- the loop -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Collect one step and return its outputs; launch the next one first when it can be scheduled ahead."""
        if self._inflight is None:
            started = time.perf_counter()
            if self.speculator is not None:
                self.speculator.plan(self.scheduler.running)
            out = self.scheduler.schedule()
            if not out.scheduled:
                return []
            drafts = self.speculator.propose(out) if self.speculator is not None else None
            self._inflight = self._launch(out, drafts=drafts, started=started)
        inflight, self._inflight = self._inflight, None
        self._inflight = self._launch_ahead(inflight)
        return self._finish(inflight)

    def _launch(self, out: SchedulerOutput, prev: LaunchedStep | None = None, drafts=None,
                started: float | None = None) -> _InFlight:
        started = time.perf_counter() if started is None else started
        launched = self.model_runner.launch(out.scheduled, out.blocks_to_copy, prev, draft_probs=drafts)
        return _InFlight(out, launched, started, speculated=prev is None and self.speculator is not None)

    def _launch_ahead(self, inflight: _InFlight) -> _InFlight | None:
        """The next step, launched while `inflight` runs, when it is a decode step of the same sequences.
        Not with a grammar in the batch (the next mask needs this step's token accepted first), nor while
        speculating (the next step's drafts need this step's tokens)."""
        if not self.async_scheduling or self.speculator is not None or any(
                item.seq.sampling_params.structured_outputs is not None for item in inflight.out.scheduled):
            return None
        ahead = self.scheduler.schedule_ahead(inflight.out)
        return None if ahead is None else self._launch(ahead, inflight.launched)

    def _finish(self, inflight: _InFlight) -> list[RequestOutput]:
        """Wait for a launched step's tokens, then the scheduler's bookkeeping and the outputs. Rows of sequences
        that finished after the step was launched (ghosts, see scheduler.py) are dropped."""
        out = inflight.out
        sampled = self.model_runner.collect(inflight.launched)
        if any(item.seq.status is not SequenceStatus.RUNNING for item in out.scheduled):
            out.scheduled = [item for item in out.scheduled if item.seq.status is SequenceStatus.RUNNING]
        ids = {k: [t.token_id for t in v] for k, v in sampled.items()}
        self.scheduler.postprocess(out, ids)
        now = time.perf_counter()
        if inflight.speculated:
            self._count_drafts(self.speculator.observe(out, ids, now - inflight.started))
        return self._outputs(out, sampled, inflight.started, now)

    def _count_drafts(self, per_request: dict[str, tuple[int, int]]) -> None:
        for request_id, (drafts, accepted) in per_request.items():
            request = self.requests.get(request_id)
            if request is not None:
                request.metrics.num_draft_tokens += drafts
                request.metrics.num_accepted_tokens += accepted

    def enable_speculation(self) -> None:
        """A request asked for speculative decoding on an engine without a method: the n-gram default."""
        if self.speculator is None:
            self.speculator = spec_build.speculator(spec_build.default_config(), self)

    def _outputs(self, out, sampled: dict, started: float, now: float) -> list[RequestOutput]:
        deltas: dict[str, list[CompletionOutput]] = {}
        for item in out.scheduled:
            request = self.requests.get(item.seq.request_id)
            if request is None:
                continue
            if request.metrics.first_scheduled_time is None:
                request.metrics.first_scheduled_time = started
                request.num_cached_tokens = item.seq.num_cached_tokens
            if item.num_spec_tokens:
                tokens = sampled.get(item.seq.seq_id, [])[: item.num_verified_tokens]
                deltas.setdefault(item.seq.request_id, []).append(self._verified_delta(request, item.seq, tokens, now))
            elif item.should_sample:
                targets = [item.seq] + sorted((c for c in out.forked if c.request_id == item.seq.request_id),
                                              key=lambda c: c.sample_index)
                for seq, token in zip(targets, sampled[item.seq.seq_id], strict=False):
                    deltas.setdefault(seq.request_id, []).append(self._delta(request, seq, token, now)[0])
        return [self._request_output(rid, completions) for rid, completions in deltas.items()]

    def _verified_delta(self, request: _Request, seq: Sequence, tokens: list, now: float) -> CompletionOutput:
        """A verify row's tokens (up to the first that ends the sequence) as one delta."""
        merged = CompletionOutput(seq.sample_index)
        for i, token in enumerate(tokens):
            delta, ended = self._delta(request, seq, token, now, last=i == len(tokens) - 1)
            merged.text += delta.text
            merged.token_ids += delta.token_ids
            merged.logprobs += delta.logprobs
            merged.finish_reason, merged.stop_reason = delta.finish_reason, delta.stop_reason
            if ended:
                break
        return merged

    def _delta(self, request: _Request, seq: Sequence, token, now: float, last: bool = True
               ) -> tuple[CompletionOutput, bool]:
        """One token's output; `last`: the last token the sequence took this step. -> (delta, ended)."""
        detok = self._detokenizer(request, seq)
        stop_token = last and seq.is_finished and seq.finish_reason == "stop"
        delta = CompletionOutput(seq.sample_index)
        ended = last and seq.is_finished
        if not stop_token:
            delta.text = detok.add(token.token_id)
            delta.token_ids = [token.token_id]
            if token.logprob is not None:
                delta.logprobs = [Logprob(token.token_id, token.logprob, token.top_logprobs)]
            if detok.stop_string is not None:
                self._stop_at_string(seq, detok.stop_string)
                ended = True
        if seq.sample_index == 0 and not stop_token:
            self._record_time(request.metrics, now)
        if ended:
            delta.text += detok.flush()
            delta.finish_reason, delta.stop_reason = seq.finish_reason, seq.stop_reason
            request.finished.add(seq.sample_index)
            self.model_runner.release(seq)
            if self.speculator is not None:
                self.speculator.release(seq)
        return delta, ended

    def _stop_at_string(self, seq: Sequence, stop_string: str) -> None:
        if seq.is_finished:  # a later token of the same verify row had ended it: the string comes first
            seq.finish_reason, seq.stop_reason = "stop", stop_string
        else:
            self.scheduler.finish(seq, "stop", stop_string)

    @staticmethod
    def _record_time(metrics: RequestMetrics, now: float) -> None:
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        metrics.last_token_time = now
        metrics.token_times.append(now)

    def _request_output(self, request_id: str, completions: list[CompletionOutput]) -> RequestOutput:
        request = self.requests[request_id]
        done = len(request.finished) == request.params.n
        kv_params = None
        if done:
            request.metrics.finished_time = time.perf_counter()
            del self.requests[request_id]
            kv_params = self._save_kv(request)
        return RequestOutput(request_id, request.prompt_token_ids, completions, done, request.num_cached_tokens,
                             request.metrics, kv_params)

    def _save_kv(self, request: _Request) -> dict | None:
        """A prefill leg's prompt blocks, saved for the decode engine; its ``kv_transfer_params`` answer."""
        asked = request.params.kv_transfer_params
        if not asked or not asked.get("do_remote_decode") or self.tp is not None:
            return None
        return self.kv_transfer.save(self.model_runner.kv_cache, self.scheduler.block_manager, request.request_id,
                                     request.prompt_token_ids)

    # -- offline use ----------------------------------------------------------------------------

    def generate(self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Run prompts to completion; returns one cumulative output per prompt, in order. `lora_request`: one
        adapter for every prompt, or one (or None) per prompt."""
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        ids = [f"generate-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        try:
            for request_id, prompt, p, lora in zip(ids, prompts, params_list, loras, strict=True):
                self.add_request(request_id, prompt, p, lora_request=lora)
        except Exception:
            for request_id in ids:
                self.abort(request_id)
            raise
        merged: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for output in self.step():
                merged[output.request_id] = merge_outputs(merged.get(output.request_id), output)
        return [merged[i] for i in ids]

    def score(self, prompt: str | list[int]) -> torch.Tensor:
        """Next-token logits at every prompt position, [n, V] float32 (for KL checks between backends)."""
        token_ids = self._encode(prompt)
        self._check_prompt(token_ids, SamplingParams())
        return self.model_runner.score(token_ids)

    def stats(self) -> dict[str, float]:
        blocks = self.scheduler.block_manager
        return {
            "num_kvcache_blocks": blocks.num_total_blocks,
            "num_free_blocks": blocks.num_free_blocks,
            "kv_capacity_tokens": blocks.num_total_blocks * self.config.block_size,
            "kv_bytes_per_token": bytes_per_token(self.model_config, self.dtype),  # the whole model's, all ranks
            "kv_usage": blocks.usage,
        }

    def spec_decode_stats(self) -> dict | None:
        """Speculative decoding counters since start (spec_decode/metrics.py), None when it never ran."""
        return None if self.speculator is None else self.speculator.stats.as_dict()


def merge_outputs(previous: RequestOutput | None, new: RequestOutput) -> RequestOutput:
    """Fold a step's delta into the cumulative output of the same request."""
    if previous is None:
        previous = replace(new, outputs=[])
    by_index = {c.index: c for c in previous.outputs}
    for delta in new.outputs:
        total = by_index.setdefault(delta.index, CompletionOutput(delta.index))
        total.text += delta.text
        total.token_ids += delta.token_ids
        total.logprobs += delta.logprobs
        total.finish_reason, total.stop_reason = delta.finish_reason or total.finish_reason, delta.stop_reason
    outputs = sorted(by_index.values(), key=lambda c: c.index)
    return replace(new, outputs=outputs, num_cached_tokens=previous.num_cached_tokens or new.num_cached_tokens)
