"""Prompt assembly: Go TEMPLATE layer (legacy and .Messages), GGUF Jinja, SYSTEM/MESSAGE layers, truncation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from frontend.chat_format import PromptSpec, TemplateError, fit_messages, render_chat, render_generate
from core.errors import InvalidRequest
from registry.modelbuilder import CHATML_TEMPLATE

from fakes.ollama_templates import CHATML, LLAMA3_INSTRUCT, QWEN2  # noqa: E402
MISTRAL_LEGACY = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}"
MISTRAL_NO_RESPONSE = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] "
MISTRAL_MESSAGES = """[INST] {{ if .System }}{{ .System }}

{{ end }}
{{- range .Messages }}
{{- if eq .Role "user" }}{{ .Content }}[/INST] {{ else if eq .Role "assistant" }}{{ .Content }}[INST] {{ end }}
{{- end }}"""
FIM = "{{- if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>\n{{- else }}{{ .Prompt }}\n{{- end }}"

S_U_A_U = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U1"},
    {"role": "assistant", "content": "A1"},
    {"role": "user", "content": "U2"},
]
CHATML_S_U_A_U = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
                  "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n")


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


# --- Go TEMPLATE layer ---------------------------------------------------------------------------

def test_legacy_qwen2_template_matches_ollama_exactly():
    # ollama.md §6.3 step 4: flush a turn per exchange, cut the last at {{ .Response }}
    assert render_chat(PromptSpec(template=QWEN2), S_U_A_U) == CHATML_S_U_A_U


def test_messages_template_renders_the_same_chatml():
    assert render_chat(PromptSpec(template=CHATML), S_U_A_U) == CHATML_S_U_A_U


def test_llama3_messages_template():
    assert render_chat(PromptSpec(template=LLAMA3_INSTRUCT), [user("Hi")]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("template", [MISTRAL_LEGACY, MISTRAL_NO_RESPONSE, MISTRAL_MESSAGES],
                         ids=["legacy", "no-response", "messages"])
def test_legacy_and_messages_templates_agree_like_ollamas_own_tests(template):
    messages = [{"role": "system", "content": "You are a helpful assistant!"},
                user("Hello friend!"), assistant("Hello human!"), user("What is your name?")]
    assert render_chat(PromptSpec(template=template), messages) == (
        "[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human![INST] What is your name?[/INST] ")


@pytest.mark.parametrize("template", [MISTRAL_LEGACY, MISTRAL_NO_RESPONSE], ids=["legacy", "no-response"])
def test_trailing_assistant_message_is_continued(template):
    messages = [user("Hello friend!"), assistant("Hello human!"), user("What is your name?"),
                assistant("My name is Ollama and I")]
    assert render_chat(PromptSpec(template=template), messages) == (
        "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I")


def test_consecutive_same_role_messages_are_merged_but_not_tool_messages():
    messages = [user("a"), user("b"), {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"}]
    assert render_chat(PromptSpec(template=CHATML), messages) == (
        "<|im_start|>user\na\n\nb<|im_end|>\n<|im_start|>tool\nt1<|im_end|>\n<|im_start|>tool\nt2<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_system_field_joins_every_system_message():
    template = "{{ .System }}|{{ range .Messages }}{{ .Role }},{{ end }}"
    messages = [{"role": "system", "content": "one"}, user("u"), {"role": "system", "content": "two"}]
    assert render_chat(PromptSpec(template=template), messages) == "one\n\ntwo|system,user,system,"


def test_tools_and_tool_calls_reach_messages_templates():
    template = ("{{ if .Tools }}<tools>{{ range .Tools }}{{ .Function }}{{ end }}</tools>{{ end }}"
                "{{ range .Messages }}{{ .Role }}:{{ .Content }}"
                "{{ range .ToolCalls }}<call>{{ .Function.Name }} {{ .Function.Arguments }}</call>{{ end }};{{ end }}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}
    messages = [user("Weather?"), {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert render_chat(PromptSpec(template=template), messages, tools=tools) == (
        '<tools>{"name":"get_weather","parameters":{"type":"object"}}</tools>'
        'user:Weather?;assistant:<call>get_weather {"city":"Tokyo"}</call>;')


def test_template_without_response_or_messages_gets_response_appended():
    assert render_chat(PromptSpec(template="{{ .Prompt }}"), [user("a"), assistant("b"), user("c")]) == "abc"


# --- SYSTEM and MESSAGE layers -------------------------------------------------------------------

def test_system_layer_is_prepended_when_the_chat_has_no_system_message():
    spec = PromptSpec(template=CHATML, system="Be brief.")
    assert render_chat(spec, [user("Hi")]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_system_layer_is_not_used_when_the_chat_starts_with_system():
    spec = PromptSpec(template=CHATML, system="Be brief.")
    assert render_chat(spec, S_U_A_U) == CHATML_S_U_A_U


def test_message_layer_comes_before_the_request_after_the_system_layer():
    spec = PromptSpec(template=CHATML, system="Sys", messages=[user("Is Toronto in Canada?"), assistant("yes")])
    assert render_chat(spec, [user("And Paris?")]) == (
        "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nIs Toronto in Canada?<|im_end|>\n"
        "<|im_start|>assistant\nyes<|im_end|>\n<|im_start|>user\nAnd Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_from_details_reads_layers_and_gguf_template():
    details = SimpleNamespace(template=None, system="Sys", messages=[user("m")],
                              gguf=SimpleNamespace(chat_template=CHATML_TEMPLATE))
    spec = PromptSpec.from_details(details, bos_token="<s>", eos_token="</s>")
    assert spec == PromptSpec(template=None, jinja_template=CHATML_TEMPLATE, system="Sys", messages=[user("m")],
                              bos_token="<s>", eos_token="</s>")
    assert PromptSpec.from_details(SimpleNamespace(template="T", system=None, messages=[], gguf=None)).template == "T"


# --- Jinja (GGUF tokenizer.chat_template) and fallback ------------------------------------------

def test_jinja_chatml_from_modelbuilder_equals_the_go_rendering():
    assert render_chat(PromptSpec(jinja_template=CHATML_TEMPLATE), S_U_A_U) == CHATML_S_U_A_U
    spec = PromptSpec(jinja_template=CHATML_TEMPLATE, system="Sys")
    assert render_chat(spec, [user("Hi")]) == render_chat(PromptSpec(template=CHATML, system="Sys"), [user("Hi")])


def test_go_template_wins_over_jinja():
    assert render_chat(PromptSpec(template=QWEN2, jinja_template="ignored"), S_U_A_U) == CHATML_S_U_A_U


def test_jinja_gets_tokens_tools_and_generation_prompt():
    source = ("{{ bos_token }}{% for t in tools %}{{ t.function.name }}{% endfor %}"
              "|{{ add_generation_prompt }}{{ eos_token }}")
    spec = PromptSpec(jinja_template=source, bos_token="<s>", eos_token="</s>")
    assert render_chat(spec, [user("x")], tools=[{"function": {"name": "f"}}]) == "<s>f|True</s>"


def test_jinja_trims_blocks_like_apply_chat_template():
    source = "{% for m in messages %}\n  {% if m.content %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}"
    assert render_chat(PromptSpec(jinja_template=source), [user("a"), user("b")]) == "a\nb\n"


@pytest.mark.parametrize("source, message", [
    ("{{ ''.__class__ }}", "unsafe"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ messages.append(1) }}", "unsafe"),
    ("{{ raise_exception('roles must alternate') }}", "chat template error: roles must alternate"),
    ("ok\n{% if %}", "chat template does not parse: line 2"),
    ("{{ missing.attribute }}", "chat template failed"),
])
def test_jinja_sandbox_and_errors_raise_template_error(source, message):
    with pytest.raises(TemplateError, match=message):
        render_chat(PromptSpec(jinja_template=source), [user("x")])


def test_plain_fallback_without_any_template():
    assert render_chat(PromptSpec(system="S"), [user("Hi"), assistant("Yo"), user("Bye")]) == (
        "System: S\nUser: Hi\nAssistant: Yo\nUser: Bye\nAssistant: ")


# --- /api/generate -------------------------------------------------------------------------------

def test_generate_uses_the_system_layer_and_the_system_override():
    spec = PromptSpec(template=QWEN2, system="Default")
    assert render_generate(spec, "Hi") == (
        "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert render_generate(spec, "Hi", system="Other").startswith("<|im_start|>system\nOther<|im_end|>\n")


def test_generate_template_override_and_message_layer():
    spec = PromptSpec(template=QWEN2, messages=[user("seed"), assistant("ok")])
    # "{{ .Prompt }}!" uses neither .Messages nor .Response, so "{{ .Response }}" is appended
    assert render_generate(spec, "Hi", template="{{ .Prompt }}!") == "seed!okHi!"


def test_generate_without_templates_returns_the_prompt_unchanged():
    assert render_generate(PromptSpec(system="S"), "raw text") == "raw text"


def test_generate_with_only_jinja_renders_a_one_message_chat():
    assert render_generate(PromptSpec(jinja_template=CHATML_TEMPLATE), "Hi", system="S") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_generate_with_suffix_renders_fill_in_the_middle():
    spec = PromptSpec(template=FIM)
    assert render_generate(spec, "def add(", suffix="return x") == "<PRE> def add( <SUF>return x <MID>"
    assert render_generate(spec, "hello") == "hello"


def test_generate_with_suffix_on_a_template_without_suffix_is_refused():
    with pytest.raises(InvalidRequest, match="does not support insert"):
        render_generate(PromptSpec(template=QWEN2), "def add(", suffix="return x")


# --- fit_messages --------------------------------------------------------------------------------

def words(text: str) -> int:
    return len(text.split())


def test_fit_messages_keeps_everything_when_it_fits():
    spec = PromptSpec(template=CHATML)
    assert fit_messages(spec, S_U_A_U, count_tokens=words, limit=100) == (CHATML_S_U_A_U, 0)


def test_fit_messages_drops_the_oldest_non_system_messages():
    spec = PromptSpec(template="{{ range .Messages }}{{ .Content }} {{ end }}")
    messages = [{"role": "system", "content": "sys"}, user("one"), assistant("two"), user("three"),
                assistant("four"), user("five")]
    assert fit_messages(spec, messages, count_tokens=words, limit=3) == ("sys four five ", 3)
    assert fit_messages(spec, messages, count_tokens=words, limit=4) == ("sys three four five ", 2)


def test_fit_messages_never_drops_system_or_the_last_message():
    spec = PromptSpec(template="{{ range .Messages }}{{ .Content }} {{ end }}", system="layer")
    prompt, dropped = fit_messages(spec, [user("a"), assistant("b"), user("c d e f")], count_tokens=words, limit=1)
    assert (prompt, dropped) == ("layer c d e f ", 2)


def test_fit_messages_drops_message_layer_messages_too():
    spec = PromptSpec(template=CHATML, messages=[user("seed words here"), assistant("seed reply")])
    prompt, dropped = fit_messages(spec, [user("q")], count_tokens=len, limit=60)
    assert (prompt, dropped) == ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n", 2)
