"""Bounded template renders (``registry/templates.py`` for Go, ``frontend/bounded_jinja.py`` for Jinja):
every way a template can make work stops at a limit with TemplateLimitExceeded, a request's 400;
templates that do what chat templates do are unaffected, with orders of magnitude of room."""

from __future__ import annotations

import time

import pytest

from frontend.chat_format import PromptSpec, render_chat, render_request
from core.base import GenerationRequest
from core.errors import InvalidRequest
from registry.templates import GoTemplate, RenderLimits, TemplateLimitExceeded
from fakes.ollama_templates import QWEN2

GO_BOMBS = {
    "range over a huge int": "{{ range 20000000 }}{{ end }}",
    "nested ranges": "{{ range 1000 }}{{ range 1000 }}{{ end }}{{ end }}",
    "output": "{{ range 90000 }}" + "x" * 1000 + "{{ end }}",
    "a value that doubles": '{{ $x := "aaaaaaaaaaaaaaaa" }}' + '{{ $x = printf "%s%s" $x $x }}' * 30,
}

JINJA_BOMBS = {
    "nested loops": "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
    "loops over a long string": "{% set s = 'x' * 5000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "string times n": "{{ 'x' * 1000000000 }}",
    "list times n": "{{ ([1] * 100000000)|length }}",
    "concatenation that doubles": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                                  "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "addition that doubles": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                             "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "a filter that doubles": "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                             "{% set ns.s = ns.s|replace('x', 'xx') %}{% endfor %}",
    "a wide filter": "{{ 'x'|center(1000000000) }}",
    "a wide method": "{{ 'x'.ljust(1000000000) }}",
    "a wide % format": "{{ '%0999999999d' % 1 }}",
    "a wide str.format": "{{ '{:>999999999}'.format(1) }}",
    "a huge power": "{{ 2 ** 100000000 }}",
    "text in a loop": "{% for i in range(90000) %}" + "x" * 1000 + "{% endfor %}",
}


@pytest.mark.parametrize("name", list(GO_BOMBS))
def test_go_bombs_stop_at_a_limit(name):
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitExceeded):
        GoTemplate(GO_BOMBS[name]).render({})
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("name", list(JINJA_BOMBS))
def test_jinja_bombs_stop_at_a_limit(name):
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitExceeded):
        render_chat(PromptSpec(jinja_template=JINJA_BOMBS[name]), [{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 1.0


def test_the_time_limit_stops_slow_work_that_fits_the_other_limits():
    slow = "{% for a in range(90000) %}{{ 'x'.upper() }}{% endfor %}"
    from frontend.bounded_jinja import render_bounded
    from frontend.chat_format import _jinja_template

    with pytest.raises(TemplateLimitExceeded, match="took more than"):
        render_bounded(_jinja_template(slow), RenderLimits(max_seconds=0.001))
    with pytest.raises(TemplateLimitExceeded, match="took more than"):
        GoTemplate("{{ range 90000 }}{{ print 1 }}{{ end }}").render({}, RenderLimits(max_seconds=0.001))


def test_a_request_template_bomb_is_a_400_naming_the_template():
    request = GenerationRequest(model="m", prompt="hi", template=GO_BOMBS["range over a huge int"])
    with pytest.raises(InvalidRequest, match="loops more than 100000 times") as caught:
        render_request(PromptSpec(), request, len, 1000)
    assert caught.value.status == 400 and caught.value.param == "template"


def test_real_chat_templates_keep_their_room():
    """A conversation of 5,000 messages with 50 tools renders through Ollama's qwen2 template and a
    Jinja template that loops the same way."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(5000)]
    tools = [{"type": "function", "function": {"name": f"f{i}", "description": "d", "parameters": {}}}
             for i in range(50)]
    go = render_chat(PromptSpec(template=QWEN2), messages, tools=tools)
    jinja = ("{% for tool in tools %}{{ tool.function.name }}{% endfor %}"
             "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ loop.index }}/{{ loop.length }}{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    text = render_chat(PromptSpec(jinja_template=jinja), messages, tools=tools)
    assert "message 4999" in go
    assert text.endswith("message 49995000/5000<|assistant|>") and text.startswith("f0f1")


def test_the_sandbox_still_refuses_unsafe_attributes():
    with pytest.raises(Exception, match="unsafe"):
        render_chat(PromptSpec(jinja_template="{{ ''.__class__.__mro__ }}"), [{"role": "user", "content": "hi"}])


def test_the_limits_grow_with_what_the_request_sends():
    """A render may loop 8 times per item of its data's lists and write twice its text, on top of the
    fixed limits: a long conversation renders, and a prompt too long for any context reaches the
    context check (a 400 that says so) instead of a template limit."""
    small = RenderLimits(max_iterations=10, max_output=100)
    data = {"Messages": [{"Content": "x" * 50} for _ in range(20)]}
    assert small.for_data(data) == RenderLimits(10 + 8 * 20, 100 + 2 * 50 * 20, small.max_seconds)
    looping = "{{ range .Messages }}{{ range $.Messages }}{{ end }}{{ .Content }}{{ end }}"  # 20 x 21 loops
    with pytest.raises(TemplateLimitExceeded):
        GoTemplate(looping).render(data, small.for_data(data))
    assert len(GoTemplate("{{ range .Messages }}{{ .Content }}{{ .Content }}{{ end }}").render(
        data, small.for_data(data))) == 2000
