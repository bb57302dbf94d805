"""Tool calls learned from real templates: capability, tag, rendering of tools and tool history, and
scripted model outputs through the parser (fed the way a stream feeds it: piece by piece)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from core.base import ToolCall
from frontend.chat_format import PromptSpec, render_chat
from core.errors import InvalidRequest
from frontend.tools.parser import ToolCallParser, supports_tools, tag_of
from frontend.tools.wire import check_tools, internal_calls, name_tool_results, ollama_messages, openai_messages
from fakes.ollama_templates import CHATML, LLAMA3_INSTRUCT, QWEN2
from tests.tools.templates import LLAMA31, QWEN25, QWEN25_JINJA

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_ONE = [{"role": "user", "content": "hi"}]
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "",
            "tool_calls": internal_calls([{"id": "call_1", "function": {"name": "get_weather",
                                                                        "arguments": '{"city": "Paris"}'}}], "m")},
           {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}]


def model(template: str | None = None, jinja: str | None = None):
    """What the parser reads of a model's details: its Go TEMPLATE layer, else its GGUF Jinja template."""
    return SimpleNamespace(template=template, chat_template=template or jinja)


@pytest.mark.parametrize("template, tools", [(QWEN25, True), (LLAMA31, True), (QWEN2, False), (CHATML, False),
                                             (LLAMA3_INSTRUCT, False)])
def test_capability_is_read_from_the_go_template(template, tools):
    assert supports_tools(model(template)) is tools


def test_capability_and_tag_of_jinja_templates():
    assert supports_tools(model(jinja=QWEN25_JINJA)) and tag_of(model(jinja=QWEN25_JINJA)) == "<tool_call>"
    chatml_jinja = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert not supports_tools(model(jinja=chatml_jinja))


def test_tag_is_the_text_in_the_tool_calls_branch():
    assert tag_of(model(QWEN25)) == "<tool_call>"
    assert tag_of(model(LLAMA31)) == "{"  # bare JSON calls


def test_tools_and_history_render_with_the_go_qwen_template():
    prompt = render_chat(PromptSpec(template=QWEN25), name_tool_results([dict(m) for m in HISTORY]), tools=[WEATHER])
    assert ('<tools>\n{"type": "function", "function": {"name":"get_weather","description":"Weather in a city",'
            '"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}\n</tools>'
            in prompt)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tools_and_history_render_with_the_go_llama_template():
    prompt = render_chat(PromptSpec(template=LLAMA31), [dict(m) for m in HISTORY], tools=[WEATHER])
    assert '{"name": "get_weather", "parameters": {"city":"Paris"}}' in prompt
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>" in prompt


def test_tools_and_history_render_with_the_jinja_qwen_template():
    prompt = render_chat(PromptSpec(jinja_template=QWEN25_JINJA), [dict(m) for m in HISTORY], tools=[WEATHER])
    assert '\n{"type": "function", "function": {"name": "get_weather"' in prompt
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in prompt


def parse(tag: str, pieces: list[str], names=("get_weather",)) -> tuple[str, list[ToolCall]]:
    parser = ToolCallParser(tag, list(names))
    text, calls = "", []
    for piece in pieces:
        shown, found = parser.feed(piece)
        text, calls = text + shown, calls + found
    shown, found = parser.finish()
    return text + shown, calls + found


def args(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes_call_streamed_one_character_at_a_time():
    output = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text, calls = parse("<tool_call>", list(output))
    assert text == "Let me check.\n" and args(calls) == [("get_weather", {"city": "Paris"})]
    assert calls[0].id.startswith("call_")


def test_hermes_parallel_calls_and_braces_inside_strings():
    output = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a}b{"}}\n</tool_call>')
    text, calls = parse("<tool_call>", [output[:30], output[30:75], output[75:]])
    assert text == "" and args(calls) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "a}b{"})]


def test_text_that_only_looks_like_the_tag_passes_through_unchanged():
    assert parse("<tool_call>", ["I <b>think</b> so <tool"]) == ("I <b>think</b> so <tool", [])
    plain = 'Use <tool_call>{"name": "unknown_fn", "arguments": {}}</tool_call> maybe'
    assert parse("<tool_call>", [plain]) == (plain, [])


def test_held_back_tag_prefix_is_released_when_it_is_not_the_tag():
    parser = ToolCallParser("<tool_call>", ["get_weather"])
    assert parser.feed("a <tool") == ("a ", [])
    assert parser.feed("s> b") == ("<tools> b", [])


def test_llama_json_calls_with_parameters_and_python_tag():
    output = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
    assert args(parse("{", list(output))[1]) == [("get_weather", {"city": "Tokyo"})]
    two = '{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_weather", "arguments": {"city": "B"}}'
    assert args(parse("{", [two])[1]) == [("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})]


def test_json_mode_leaves_prose_and_non_calls_alone():
    assert parse("{", ["The set {1, 2} is small."]) == ("The set {1, 2} is small.", [])
    assert parse("{", [' {"answer": 42}']) == (' {"answer": 42}', [])
    cut = '{"name": "get_weather", "parameters": {"city": "Par'  # max_tokens hit mid-call
    assert parse("{", [cut]) == (cut, [])


def test_tool_list_and_choice_checks():
    check_tools([WEATHER], {"type": "function", "function": {"name": "get_weather"}})
    bad = [({"type": "function", "function": {"name": "x", "parameters": {"type": "string"}}}, "auto"),
           ({"type": "function", "function": {"name": "bad name"}}, "auto"),
           ({"type": "function", "function": {"name": "x", "parameters": {"type": "object", "required": "city"}}},
            "auto"),
           (WEATHER, {"type": "function", "function": {"name": "nope"}})]
    for tool, choice in bad:
        with pytest.raises(InvalidRequest):
            check_tools([tool], choice)
    with pytest.raises(InvalidRequest, match="only allowed when 'tools'"):
        check_tools(None, "required")


def test_history_on_each_backend_wire():
    messages = name_tool_results([dict(m) for m in HISTORY])
    openai = openai_messages(messages)
    assert openai[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert openai[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}
    ollama = ollama_messages(messages)
    assert ollama[1]["tool_calls"] == [{"id": "call_1", "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}}]
    assert ollama[2]["tool_name"] == "get_weather"


def test_prompt_only_backends_refuse_tools_instead_of_ignoring_them():
    from core.base import GenerationRequest
    from frontend.prompt_text import render_prompt

    request = GenerationRequest(model="m", messages=list(ASK_ONE), tools=[WEATHER])
    with pytest.raises(InvalidRequest, match="tools need a backend that returns tool calls"):
        render_prompt(request, PromptSpec())
    request.tool_choice = "none"
    assert render_prompt(request, PromptSpec()) == "User: hi\nAssistant: "

