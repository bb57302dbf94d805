"""Splitting a reasoning model's output: tags split across pieces, output that starts inside the thinking,
a late ``<think>`` that is text, and the reasoning-token count on the final record."""

from __future__ import annotations

import asyncio

import pytest

from core.base import Chunk, Done, Timings, Usage
from frontend.chat_format import PromptSpec
from frontend.reasoning import ReasoningParser, split_events, starts_thinking


def split(pieces: list[str], *, thinking: bool = False) -> tuple[str, str, bool]:
    parser = ReasoningParser(thinking=thinking)
    parts = [parser.feed(p) for p in pieces] + [parser.finish()]
    return "".join(t for t, _ in parts), "".join(x for _, x in parts), parser.thought


@pytest.mark.parametrize("pieces, thinking, expected", [
    (["<th", "ink>\nhmm", " ok</th", "ink>\n\nAnswer", " here"], False, ("hmm ok", "Answer here", True)),
    (["hmm ok", "</think>", "\n\nAnswer"], True, ("hmm ok", "Answer", True)),  # the prompt opened the tag
    (["Hello <think> x"], False, ("", "Hello <think> x", False)),  # not at the start: text
    (["  ", "<think>a b", " c"], False, ("a b c", "", True)),  # never closed: all thinking
    (["<", "b>"], False, ("", "<b>", False)),  # a false start is given back
    (["<think>a</think>b<think>c</think>"], False, ("a", "b<think>c</think>", True)),  # one thinking part only
])
def test_parser(pieces, thinking, expected):
    assert split(pieces, thinking=thinking) == expected


def test_the_generation_prompt_decides_where_the_output_starts():
    opens = PromptSpec(template="{{ range .Messages }}{{ .Content }}{{ end }}{{ if .Think }}<think>\n{{ end }}")
    assert starts_thinking(opens, True) and not starts_thinking(opens, None)
    jinja = PromptSpec(jinja_template="{{ messages[0].content }}{% if enable_thinking is defined and "
                                      "not enable_thinking %}<think>\n\n</think>{% endif %}")
    assert not starts_thinking(jinja, False) and not starts_thinking(jinja, None)


def test_reasoning_tokens_are_the_thinking_chunks_tokens():
    async def events():
        for text, token in [("<think>", 1), ("plan", 2), ("</think>", 3), ("\n\n", 4), ("Hi", 5)]:
            yield Chunk(text, [token])
        yield Done("stop", Usage(input_tokens=3, output_tokens=5), Timings())

    async def run():
        return [e async for e in split_events(events(), ReasoningParser())]
    out = asyncio.run(run())
    chunks, done = out[:-1], out[-1]
    assert "".join(c.thinking for c in chunks) == "plan" and "".join(c.text for c in chunks) == "Hi"
    assert done.usage.reasoning_tokens == 3 and sum(len(c.token_ids) for c in chunks) == 5
