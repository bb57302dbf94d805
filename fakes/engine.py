"""A deterministic stand-in for a model, shared by every fake server so one test knows every answer.

- prompt tokens: ``len(text.split())``; a chat is first rendered as ``"{role}: {content}\\n"`` lines;
- output: the eight :data:`WORDS` in a cycle, starting at ``prompt_tokens % 8``; token id = index + 100;
- ``max_tokens`` (default 16) reached → finish ``"length"``;
- a stop string that the text would contain once the next token is added → that token is not
  produced (nor counted) and the finish is ``"stop"``.

    FakeEngine.generate("hello world", 3)      # [(102, " charlie"), (103, " delta"), (104, " echo")]
    FakeEngine.expected_text("hello world", 3, stop="delta")   # " charlie"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WORDS = (" alpha", " bravo", " charlie", " delta", " echo", " foxtrot", " golf", " hotel")
FIRST_ID = 100
DEFAULT_MAX_TOKENS = 16

Prompt = str | list[dict[str, Any]]
Stop = str | list[str] | None


@dataclass(frozen=True)
class Generation:
    """What one request produces: visible tokens, why it ended, and the prompt size."""

    tokens: list[tuple[int, str]]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    stop_sequence: str | None = None  # the stop string that ended it

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.tokens)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


class FakeEngine:
    """Every method takes a prompt string or a list of chat messages."""

    @staticmethod
    def render(prompt: Prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return "".join(f"{m.get('role', '')}: {content_text(m.get('content'))}\n" for m in prompt)

    @classmethod
    def prompt_tokens(cls, prompt: Prompt) -> int:
        return len(cls.render(prompt).split())

    @classmethod
    def run(cls, prompt: Prompt, max_tokens: int | None = None, stop: Stop = None) -> Generation:
        limit = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        stops = [s for s in ([stop] if isinstance(stop, str) else stop or []) if s]
        start = cls.prompt_tokens(prompt)
        tokens: list[tuple[int, str]] = []
        text = ""
        while len(tokens) < limit:
            index = (start + len(tokens)) % len(WORDS)
            hit = next((s for s in stops if s in text + WORDS[index]), None)
            if hit is not None:
                return Generation(tokens, "stop", start, hit)
            tokens.append((FIRST_ID + index, WORDS[index]))
            text += WORDS[index]
        return Generation(tokens, "length", start)

    @classmethod
    def generate(cls, prompt: Prompt, max_tokens: int | None = None, stop: Stop = None) -> list[tuple[int, str]]:
        return cls.run(prompt, max_tokens, stop).tokens

    @classmethod
    def expected_text(cls, prompt: Prompt, max_tokens: int | None = None, stop: Stop = None) -> str:
        return cls.run(prompt, max_tokens, stop).text

    @classmethod
    def finish_reason(cls, prompt: Prompt, max_tokens: int | None = None, stop: Stop = None) -> str:
        return cls.run(prompt, max_tokens, stop).finish_reason


def content_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts whose ``text`` parts are joined."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)
