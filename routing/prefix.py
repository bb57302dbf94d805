"""Which backend of a route is likely to hold a prompt's prefix in its KV cache: an approximate index
of what the gateway has sent each backend, and the ``prefix`` strategy's choice over it.

**What is hashed.** The gateway has no token ids for a remote backend (it never sees the backend's
tokenizer or chat template), so the index works on text: the request rendered as the route sees it
(``prompt_text``: each chat message as ``role \\x1f content \\x1e``, in order; a prompt as its system
text and prompt) cut into blocks of ``block_chars`` characters (128 by default: about 32 tokens at
the usual 4 characters a token, two of vLLM's 16-token blocks). Block ``i``'s key is Python's hash
of ``(key i-1, block text)``, the first key the route's name, so a key stands for the whole prefix up
to its block's end (llm-d's approximate scorer chains xxhash over 64-byte blocks the same way;
SGLang's router keeps a character radix tree). A trailing part shorter than a block is not indexed,
and text past ``max_blocks`` blocks is not looked at (two prompts alike that far are not told apart).
Python's string hash is salted per process: keys never leave it.

**What is kept.** For each key the set of backends (a bit mask) that were sent a prompt with that
prefix, and per backend an LRU of its keys. Sending a request to a backend inserts (touches) all its
keys there, last block first, so a prefix shared by many prompts stays more recently used than any
one prompt's tail and is evicted last. A backend keeps at most its capacity: its KV cache size in
tokens (what the backend reports, e.g. vLLM's ``cache_config_info``; else the route's
``capacity_tokens``) divided by the tokens a block stands for (``block_chars`` over the characters
per token measured on the route's traffic: the characters hashed over the prompt tokens the backends
reported, 4 until a backend has reported any); past it the least recently sent blocks go first, as
the backend's own LRU would evict them.

**The** ``prefix`` **strategy** (``choose``): the backend with the longest match, unless taking one
more request would put it above ``load_factor`` × the mean number in flight over the route's
backends (rounded up) plus ``load_slack``: consistent hashing with bounded loads (Mirrokni et al.),
so a hot prefix cannot pin one backend past its share; the slack lets a conversation wait behind
a request or two where its prefix is rather than prefill it all again elsewhere (without it, at a
few requests in flight the bound is 1-2 and turns were sent away: on bench/prefix.py's workload in
bench/slo_sim.py, slack 0 gave 0.54x least_inflight's mean TTFT, slack 2 0.31x); then the
next-longest match within the bound; a request that matches nowhere within the bound goes to the backend with the fewest in flight (then the
smallest index: the most room in its cache). A match shorter than ``min_match`` of the prompt
counts as none.

``expected_cached(match, text, prompt_tokens)``: the prompt tokens a backend is expected not to
prefill, the matched share of the text times the prompt's tokens; ``strategy: slo`` predicts TTFT
from the rest.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4.0  # for a capacity in tokens → blocks; the usual figure for English BPE vocabularies


@dataclass(frozen=True)
class PrefixPolicy:
    """The config's ``PrefixEntry`` (``routing.build.prefix_policy``), where the defaults are written."""

    block_chars: int
    max_blocks: int          # 64 KiB of text at 128 characters a block
    capacity_tokens: int     # a backend's KV cache when it reports none (an 8B model on an 80 GB GPU)
    load_factor: float       # bounded loads: at most this × the mean in flight, rounded up, ...
    load_slack: int          # ... plus this many (a short queue costs less than a prefill again)
    min_match: float         # a match below this share of the prompt counts as none


def prompt_text(request: Any) -> str:
    """The text the index hashes: chat messages as ``role\\x1fcontent\\x1e``, else system and prompt."""
    if request.is_chat:
        return "".join(f"{m.get('role', '')}\x1f{_content(m.get('content'))}\x1e" for m in request.messages or ())
    if request.prompt_tokens is not None:
        return f"{request.system or ''}\x1e" + ",".join(map(str, request.prompt_tokens))
    return f"{request.system or ''}\x1e{request.prompt or ''}"


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: their text, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def block_keys(text: str, seed: str, block_chars: int, max_blocks: int) -> list[int]:
    """The chained keys of ``text``'s whole blocks (at most ``max_blocks``)."""
    key, keys = hash(seed), []
    end = min(len(text) // block_chars, max_blocks) * block_chars
    for start in range(0, end, block_chars):
        key = hash((key, text[start:start + block_chars]))
        keys.append(key)
    return keys


class PrefixIndex:
    """Per backend (by position ``0..n-1``), the keys it was sent, in LRU order, within its capacity."""

    def __init__(self, backends: int, policy: PrefixPolicy):
        self.policy = policy
        self.owners: dict[int, int] = {}  # key → bit mask of the backends that hold it
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(backends)]
        self.chars_per_token = CHARS_PER_TOKEN
        self.capacity_tokens = [float(policy.capacity_tokens)] * backends
        self.capacity = [self.blocks_for(policy.capacity_tokens)] * backends
        self.evicted = [0] * backends

    def blocks_for(self, tokens: float) -> int:
        return max(1, int(tokens * self.chars_per_token / self.policy.block_chars))

    def set_capacity(self, backend: int, tokens: float) -> None:
        """The backend's KV cache holds ``tokens``: its share of the index follows."""
        self.capacity_tokens[backend] = float(tokens)
        self.capacity[backend] = self.blocks_for(tokens)
        self._evict(backend)

    def set_chars_per_token(self, ratio: float) -> None:
        """The route's text turns out to have ``ratio`` characters a token: the capacities follow."""
        self.chars_per_token = ratio
        for backend, tokens in enumerate(self.capacity_tokens):
            self.set_capacity(backend, tokens)

    def match(self, keys: list[int]) -> list[int]:
        """How many of ``keys`` (from the first) each backend holds."""
        matched = [0] * len(self.lru)
        alive = (1 << len(self.lru)) - 1
        owners = self.owners
        for depth, key in enumerate(keys, 1):
            alive &= owners.get(key, 0)
            if not alive:
                break
            bits = alive
            while bits:
                low = bits & -bits
                matched[low.bit_length() - 1] = depth
                bits ^= low
        return matched

    def insert(self, backend: int, keys: list[int]) -> None:
        """``backend`` was sent a prompt with these keys: it holds them now, most recently used."""
        lru, owners, bit = self.lru[backend], self.owners, 1 << backend
        for key in reversed(keys):  # the first block ends up the most recent: tails are evicted first
            if key in lru:
                lru.move_to_end(key)
            else:
                lru[key] = None
                owners[key] = owners.get(key, 0) | bit
        self._evict(backend)

    def clear(self, backend: int) -> None:
        """The backend lost its cache (a restart, vLLM's AllBlocksCleared)."""
        for key in list(self.lru[backend]):
            self._drop(backend, key)

    def size(self, backend: int) -> int:
        return len(self.lru[backend])

    def _evict(self, backend: int) -> None:
        lru = self.lru[backend]
        while len(lru) > self.capacity[backend]:
            key = next(iter(lru))
            self._drop(backend, key)
            self.evicted[backend] += 1

    def _drop(self, backend: int, key: int) -> None:
        self.lru[backend].pop(key, None)
        mask = self.owners.get(key, 0) & ~(1 << backend)
        if mask:
            self.owners[key] = mask
        else:
            self.owners.pop(key, None)


def expected_cached(matched_blocks: int, text_chars: int, block_chars: int, prompt_tokens: int) -> int:
    """The prompt tokens a backend holding ``matched_blocks`` is expected to find cached."""
    if not matched_blocks or not text_chars:
        return 0
    return min(prompt_tokens, int(prompt_tokens * matched_blocks * block_chars / text_chars))


def choose(matched: list[int], in_flight: list[int], sizes: list[int], candidates: list[int], total_blocks: int,
           policy: PrefixPolicy) -> int:
    """The position (among ``candidates``, the backends a request may go to) the ``prefix`` strategy picks."""
    total = sum(in_flight[i] for i in candidates) + 1
    bound = math.ceil(policy.load_factor * total / len(candidates)) + policy.load_slack
    least = min(candidates, key=lambda i: (in_flight[i], sizes[i], i))
    floor = max(1, math.ceil(policy.min_match * total_blocks))
    best = max((i for i in candidates if matched[i] >= floor and in_flight[i] + 1 <= bound),
               key=lambda i: (matched[i], -in_flight[i], -i), default=None)
    return least if best is None else best


@dataclass
class Lookup:
    """One request's view of the index: its keys and, per member, the prompt tokens expected cached."""

    keys: list[int]
    matched: list[int]        # blocks matched, by member position
    cached: dict[str, int]    # member name → expected cached prompt tokens (members with a match)
    total_blocks: int
    shares: dict[str, float]  # member name → the matched share of the prompt's text
    text_chars: int = 0

    def cached_of(self, name: str, prompt_tokens: int) -> int:
        """The expected cached tokens of a prompt of ``prompt_tokens`` (the backend's own count) there."""
        return min(prompt_tokens, round(self.shares.get(name, 0.0) * prompt_tokens))


class RoutePrefixes:
    """A route's prefix index over its members (by name), and how well it has guessed."""

    def __init__(self, route: str, names: list[str], policy: PrefixPolicy):
        self.route, self.names, self.policy = route, list(names), policy
        self.position = {name: i for i, name in enumerate(self.names)}
        self.index = PrefixIndex(len(self.names), policy)
        self.expected = dict.fromkeys(self.names, 0)   # Σ expected cached tokens of requests served
        self.reported = dict.fromkeys(self.names, 0)   # Σ cached tokens the backend reported for them
        self.prompts = dict.fromkeys(self.names, 0)    # Σ prompt tokens of those requests
        self.capacity_source = dict.fromkeys(self.names, "configured")
        self.chars = self.tokens = 0  # characters hashed and prompt tokens reported, for chars per token

    def lookup(self, request: Any, prompt_tokens: int) -> Lookup:
        text = prompt_text(request)
        keys = block_keys(text, self.route, self.policy.block_chars, self.policy.max_blocks)
        matched = self.index.match(keys)
        cached = {self.names[i]: expected_cached(n, len(text), self.policy.block_chars, prompt_tokens)
                  for i, n in enumerate(matched) if n}
        shares = {self.names[i]: min(1.0, n * self.policy.block_chars / len(text)) for i, n in enumerate(matched) if n}
        return Lookup(keys, matched, cached, len(keys), shares, len(text))

    def pick(self, lookup: Lookup, members: list[Any]) -> Any | None:
        """The ``prefix`` strategy's member among ``members`` (those a request may go to now)."""
        if not members:
            return None
        positions = [self.position[m.name] for m in members]
        in_flight = [0] * len(self.names)
        for m in members:
            in_flight[self.position[m.name]] = m.in_flight
        sizes = [self.index.size(i) for i in range(len(self.names))]
        chosen = choose(lookup.matched, in_flight, sizes, positions, lookup.total_blocks, self.policy)
        return next(m for m in members if self.position[m.name] == chosen)

    def precise(self, name: str, lookup: Lookup, share: float, prompt_tokens: int) -> None:
        """The backend ``name`` published its cache (``kv_events.py``): it holds ``share`` of the prompt."""
        lookup.shares[name] = share
        lookup.matched[self.position[name]] = round(share * lookup.total_blocks)
        cached = min(prompt_tokens, round(share * prompt_tokens))
        if cached:
            lookup.cached[name] = cached
        else:
            lookup.cached.pop(name, None)

    def sent(self, name: str, lookup: Lookup) -> None:
        self.index.insert(self.position[name], lookup.keys)

    def served(self, name: str, lookup: Lookup, prompt_tokens: int, reported: int | None) -> None:
        """A request finished there: what the index expected cached, against the backend's own figure;
        its characters per prompt token (the capacities in blocks follow when it moves by a tenth)."""
        if prompt_tokens > 0 and lookup.text_chars:
            self.chars, self.tokens = self.chars + lookup.text_chars, self.tokens + prompt_tokens
            ratio = self.chars / self.tokens
            if abs(ratio - self.index.chars_per_token) > 0.1 * self.index.chars_per_token:
                self.index.set_chars_per_token(ratio)
        if reported is None:
            return
        self.expected[name] += lookup.cached_of(name, prompt_tokens)
        self.reported[name] += reported
        self.prompts[name] += prompt_tokens

    def set_capacity(self, name: str, tokens: float, source: str) -> None:
        if name in self.position and tokens > 0:
            self.index.set_capacity(self.position[name], tokens)
            self.capacity_source[name] = source

    def clear(self, name: str) -> None:
        self.index.clear(self.position[name])

    def view(self, name: str) -> dict[str, Any]:
        """The member's part of ``GET /infer/routes``."""
        i = self.position[name]
        return {"prefix_blocks": self.index.size(i), "prefix_capacity_blocks": self.index.capacity[i],
                "prefix_chars_per_token": round(self.index.chars_per_token, 3),
                "prefix_capacity_source": self.capacity_source[name], "prefix_evicted_blocks": self.index.evicted[i],
                "cached_tokens_expected": self.expected[name], "cached_tokens_reported": self.reported[name],
                "cache_hit_ratio": self.reported[name] / self.prompts[name] if self.prompts[name] else None}
