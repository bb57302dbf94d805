"""Multi-turn chat sessions for prefix-cache benchmarks: users who share a few long system prompts,
each holding a conversation of several turns with think time between them.

Conversation ``i`` starts at a uniform time in ``[0, spread_s)``, uses system prompt ``i % systems``
(``system_words`` words each, distinct between prompts; by default one per conversation: a user's own
instructions and documents), and has ``turns`` turns; a turn is a user
message of ``user_words`` words that starts with the conversation's and the turn's number (so no two
conversations share more than their system prompt), an answer of ``max_tokens`` tokens, then a think
time drawn from an exponential distribution of mean ``think_s`` before the next turn. Every draw is
from one seeded generator: the same seed gives the same sessions.

    for c in conversations(seed=7):
        messages = [c.system_message()] ; ...
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    user: str          # the user's message
    max_tokens: int
    think_s: float     # the pause after the answer, before the next turn


@dataclass(frozen=True)
class Conversation:
    index: int
    start_s: float
    system: str
    turns: tuple[Turn, ...]

    def system_message(self) -> dict:
        return {"role": "system", "content": self.system}


@dataclass(frozen=True)
class Workload:
    count: int = 24
    systems: int | None = None    # system prompts shared round-robin; None: one per conversation
    system_words: int = 1500
    turns: tuple[int, int] = (6, 10)
    user_words: tuple[int, int] = (20, 80)
    max_tokens: tuple[int, int] = (16, 48)
    think_s: float = 2.0
    spread_s: float = 10.0


def system_prompt(index: int, words: int) -> str:
    return " ".join(f"s{index}w{i}" for i in range(words))


def conversations(workload: Workload = Workload(), seed: int = 7) -> list[Conversation]:
    rng = random.Random(seed)
    count = workload.systems or workload.count
    systems = [system_prompt(i, workload.system_words) for i in range(count)]
    out = []
    for i in range(workload.count):
        turns = tuple(Turn(" ".join([f"c{i}t{t}"] + ["word"] * (rng.randint(*workload.user_words) - 1)),
                           rng.randint(*workload.max_tokens), rng.expovariate(1 / workload.think_s))
                      for t in range(rng.randint(*workload.turns)))
        out.append(Conversation(i, rng.uniform(0, workload.spread_s), systems[i % count], turns))
    return sorted(out, key=lambda c: c.start_s)
