"""The Go text/template interpreter: each construct, Go truthiness, errors, and real Ollama templates."""

from __future__ import annotations

import re

import pytest

from registry.templates import GoTemplate, TemplateError, to_go


def render(source: str, data=None) -> str:
    return GoTemplate(source).render({} if data is None else data)


# --- fields, variables, trimming, comments ---------------------------------------------------------

def test_plain_text_is_copied():
    assert render("hello\n  world ") == "hello\n  world "


def test_fields_nested_and_missing_keys():
    data = {"A": "a", "B": {"C": {"D": "deep"}}, "N": 3}
    assert render("{{ .A }}|{{ .B.C.D }}|{{ .N }}|{{ .Missing }}|{{ .Missing.Deeper }}", data) == "a|deep|3||"


def test_dot_dollar_and_dollar_field_inside_range():
    data = {"Name": "top", "Items": ["x", "y"]}
    expected = 'xtop["x","y"];ytop["x","y"];'
    assert render("{{ range .Items }}{{ . }}{{ $.Name }}{{ $.Items }};{{ end }}", data) == expected


def test_variables_declare_assign_and_scope():
    source = '{{ $x := "a" }}{{ $x }}{{ if true }}{{ $x = "b" }}{{ $y := "c" }}{{ $y }}{{ end }}{{ $x }}'
    assert render(source) == "acb"


def test_range_with_index_and_element_variables():
    data = {"Messages": [{"Role": "user"}, {"Role": "assistant"}]}
    assert render("{{ range $i, $m := .Messages }}{{ $i }}={{ $m.Role }} {{ end }}", data) == "0=user 1=assistant "


def test_range_single_variable_is_the_element():
    assert render("{{ range $m := .L }}{{ $m }}{{ end }}", {"L": ["a", "b"]}) == "ab"


def test_trim_markers():
    assert render("a  \n {{- .X -}} \n  b", {"X": "x"}) == "axb"
    assert render("a {{- .X }} b", {"X": "x"}) == "ax b"
    assert render("a {{ .X -}} \n b", {"X": "x"}) == "a xb"


def test_minus_without_space_is_a_number_not_a_trim():
    assert render("a {{-3}} b") == "a -3 b"


def test_comments_render_nothing_and_can_trim():
    assert render("a{{/* note */}}b") == "ab"
    assert render("a \n{{- /* multi\nline */ -}}\n b") == "ab"


def test_strings_may_contain_braces():
    assert render('{{ "}}" }}{{ `raw\\n` }}') == "}}raw\\n"


# --- control structures --------------------------------------------------------------------------

@pytest.mark.parametrize("role, expected", [("system", "S"), ("user", "U"), ("tool", "T"), ("other", "?")])
def test_if_else_if_else(role, expected):
    source = ('{{ if eq .R "system" }}S{{ else if eq .R "user" }}U{{ else if eq .R "tool" }}T'
              "{{ else }}?{{ end }}")
    assert render(source, {"R": role}) == expected


def test_with_rebinds_dot_and_else():
    source = "{{ with .Fn }}{{ .Name }}{{ else }}none{{ end }}"
    assert render(source, {"Fn": {"Name": "get_weather"}}) == "get_weather"
    assert render(source, {"Fn": {}}) == "none"


def test_else_with_chain():
    source = "{{ with .A }}a={{ . }}{{ else with .B }}b={{ . }}{{ else }}none{{ end }}"
    assert [render(source, d) for d in ({"A": 1}, {"B": 2}, {})] == ["a=1", "b=2", "none"]


def test_range_else_when_empty_or_missing():
    source = "{{ range .L }}{{ . }}{{ else }}empty{{ end }}"
    assert render(source, {"L": [1, 2]}) == "12"
    assert render(source, {"L": []}) == "empty"
    assert render(source, {}) == "empty"


def test_range_over_map_is_sorted_and_over_int():
    assert render("{{ range $k, $v := .M }}{{ $k }}={{ $v }},{{ end }}", {"M": {"b": 2, "a": 1}}) == "a=1,b=2,"
    assert render("{{ range 3 }}{{ . }}{{ end }}") == "012"


def test_break_and_continue():
    source = "{{ range .L }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ if eq . 4 }}{{ break }}{{ end }}{{ . }}{{ end }}"
    assert render(source, {"L": [1, 2, 3, 4, 5]}) == "13"


@pytest.mark.parametrize("value", ["", [], {}, 0, 0.0, False, None])
def test_go_falsy_values(value):
    assert render("{{ if .V }}yes{{ else }}no{{ end }}", {"V": value}) == "no"


@pytest.mark.parametrize("value", ["x", [0], {"a": 0}, 1, -1.5, True])
def test_go_truthy_values(value):
    assert render("{{ if .V }}yes{{ else }}no{{ end }}", {"V": value}) == "yes"


# --- pipelines and functions ---------------------------------------------------------------------

def test_pipeline_passes_value_as_last_argument():
    assert render('{{ .Name | printf "%s!" }}', {"Name": "hi"}) == "hi!"
    assert render('{{ "a" | eq "a" }}') == "true"


def test_comparisons():
    assert render('{{ eq .R "a" "b" }} {{ ne 1 2 }} {{ lt 1 2 }} {{ le 2 2 }} {{ gt "b" "a" }} {{ ge 1 2 }}',
                  {"R": "b"}) == "true true true true true false"


def test_missing_value_equals_zero_values():
    assert render('{{ eq .Missing "" }} {{ eq .Missing 0 }} {{ eq .Missing "x" }}') == "true true false"


def test_and_or_not_return_operands_and_short_circuit():
    source = ('{{ or .A "fallback" }}|{{ and .B "second" }}|{{ and "" (index "ab" 9) }}|{{ or 1 (index "ab" 9) }}'
              "|{{ not .A }}")
    assert render(source, {"B": "b"}) == "fallback|second||1|true"


def test_len_index_slice():
    data = {"L": ["a", "b", "c"], "M": {"k": "v"}}
    assert render("{{ len .L }} {{ index .L 1 }} {{ index .M \"k\" }} {{ slice .L 1 }} {{ len (slice .L 1 2) }}",
                  data) == '3 b v ["b","c"] 1'


def test_last_message_idiom_from_real_templates():
    source = ("{{ range $i, $_ := .M }}{{ $last := eq (len (slice $.M $i)) 1 }}"
              "{{ if $last }}last={{ . }}{{ end }}{{ end }}")
    assert render(source, {"M": ["a", "b", "c"]}) == "last=c"


def test_print_printf_json():
    assert render('{{ print "a" 1 2 "b" }}|{{ printf "%s-%d-%v-%q %%" "x" 3 true "y" }}') == 'a1 2b|x-3-true-"y" %'
    assert render("{{ json .V }}", {"V": {"a": [1, "<b>"]}}) == '{"a":[1,"\\u003cb\\u003e"]}'


def test_current_date_is_iso():
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", render("{{ currentDate }}"))


def test_json_objects_read_go_field_names_and_print_as_json():
    calls = to_go([{"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}])
    source = "{{ range .ToolCalls }}{{ .Function.Name }} {{ .Function.Arguments }}{{ end }}"
    assert render(source, {"ToolCalls": calls}) == 'get_weather {"city":"Tokyo"}'
    assert render("{{ .ToolCallID }}", to_go({"tool_call_id": "c1"})) == "c1"


def test_uses_reports_referenced_fields():
    template = GoTemplate("{{ if .System }}{{ .System }}{{ end }}{{ range $.Messages }}{{ .Content }}{{ end }}")
    assert template.uses("Messages") and template.uses(".System") and template.uses("Content")
    assert not template.uses("Response") and not template.uses("Prompt")


def test_cut_after_stops_at_first_response_action():
    template = GoTemplate("{{ if .P }}<u>{{ .P }}</u>{{ end }}<a>{{ .Response }}</a>tail")
    assert template.cut_after("Response").render({"P": "hi", "Response": "r"}) == "<u>hi</u><a>r"


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, message", [
    ("ok\n  {{ .A ", "line 2, column 3: unclosed action"),
    ("{{ if .A }}x", "line 1, column 1: unexpected EOF"),
    ("x{{ end }}", "line 1, column 2: unexpected {{end}}"),
    ("{{ else }}", "line 1, column 1: unexpected {{else}}"),
    ("{{ frob .A }}", "line 1, column 4: function 'frob' not defined"),
    ("{{ $x }}", "line 1, column 4: undefined variable '$x'"),
    ("{{ break }}", "line 1, column 1: {{break}} outside {{range}}"),
    ("{{ .A | }}", "missing value for command"),
    ("{{ .A .B }}", "can't give argument to non-function"),
    ("{{ .A ; }}", "line 1, column 7: unexpected ';' in action"),
    ('{{ template "x" }}', "{{template}} is not supported"),
    ("{{ if .A }}{{ else }}{{ else }}{{ end }}", "expected {{end}}, found {{else}}"),
])
def test_parse_errors_name_the_position(source, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        GoTemplate(source)


@pytest.mark.parametrize("source, message", [
    ("{{ index .L 5 }}", "line 1, column 4: error calling index: index out of range: 5"),
    ("\n{{ .S.Field }}", "line 2, column 4: can't evaluate field Field in type string"),
    ('{{ lt 1 "a" }}', "error calling lt: incompatible types for comparison"),
    ("{{ range .S }}{{ end }}", "range can't iterate over text"),
])
def test_execution_errors_name_the_position(source, message):
    with pytest.raises(TemplateError, match=re.escape(message)):
        render(source, {"L": [1], "S": "text"})


def test_template_error_is_a_value_error():
    assert issubclass(TemplateError, ValueError)


# --- real Ollama templates -----------------------------------------------------------------------

from fakes.ollama_templates import CHATML, LLAMA3_INSTRUCT, QWEN2  # noqa: E402
CONVERSATION = to_go([
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello, how are you?"},
    {"role": "assistant", "content": "I'm doing great. How can I help you today?"},
    {"role": "user", "content": "I'd like to show off how chat templating works!"},
])


def test_qwen2_legacy_template_renders_one_turn():
    turn = {"System": "S", "Prompt": "U1", "Response": "A1"}
    expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
    assert render(QWEN2, turn) == expected
    assert render(QWEN2, {"Prompt": "U2"}) == "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"


def test_chatml_messages_template():
    # ollama/ollama template/testdata/chatml.gotmpl/system-user-assistant-user
    assert render(CHATML, {"Messages": CONVERSATION}) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHello, how are you?<|im_end|>\n"
        "<|im_start|>assistant\nI'm doing great. How can I help you today?<|im_end|>\n"
        "<|im_start|>user\nI'd like to show off how chat templating works!<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_llama3_instruct_messages_template():
    # ollama/ollama template/testdata/llama3-instruct.gotmpl/system-user-assistant-user
    assert render(LLAMA3_INSTRUCT, {"Messages": CONVERSATION}) == (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello, how are you?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nI'm doing great. How can I help you today?<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nI'd like to show off how chat templating works!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


# ollama/ollama template/command-r.gotmpl: else-if chains, continue, range over a map, $.Tools
COMMAND_R = (
    "{{- if or .Tools .System }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>\n"
    "{{- if .Tools }}# Safety Preamble\n"
    "The instructions in this section override those in the task description and style guide "
    "sections. Don't answer questions that are harmful or immoral.\n"
    "\n"
    "# System Preamble\n"
    "## Basic Rules\n"
    "You are a powerful conversational AI trained by Cohere to help people. You are augmented "
    "by a number of tools, and your job is to use and consume the output of these tools to best "
    "help the user. You will see a conversation history between yourself and a user, ending "
    "with an utterance from the user. You will then see a specific instruction instructing you "
    "what kind of response to generate. When you answer the user's requests, you cite your "
    "sources in your answers, according to those instructions.\n"
    "\n"
    "{{ if .System }}# User Preamble\n"
    "{{ .System }}\n"
    "{{- end }}\n"
    "\n"
    "## Available Tools\n"
    "Here is a list of tools that you have available to you:\n"
    "{{- range .Tools }}\n"
    "\n"
    "```python\n"
    "def {{ .Function.Name }}(\n"
    "{{- range $name, $property := .Function.Parameters.Properties }}{{ $name }}: {{ "
    "$property.Type }}, {{ end }}) -> List[Dict]:\n"
    "    '''{{ .Function.Description }}\n"
    "\n"
    "{{- if .Function.Parameters.Properties }}\n"
    "\n"
    "    Args:\n"
    "{{- range $name, $property := .Function.Parameters.Properties }}\n"
    "        {{ $name }} ({{ $property.Type }}): {{ $property.Description }}\n"
    "{{- end }}\n"
    "{{- end }}\n"
    "    '''\n"
    "    pass\n"
    "```\n"
    "{{- end }}\n"
    "{{- else if .System }}{{ .System }}\n"
    "{{- end }}<|END_OF_TURN_TOKEN|>\n"
    "{{- end }}\n"
    "{{- range .Messages }}\n"
    "{{- if eq .Role \"system\" }}\n"
    "{{- continue }}\n"
    "{{- end }}<|START_OF_TURN_TOKEN|>\n"
    "{{- if eq .Role \"user\" }}<|USER_TOKEN|>{{ .Content }}\n"
    "{{- if $.Tools }}<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Write 'Action:' followed by a "
    "json-formatted list of actions that you want to perform in order to produce a good "
    "response to the user's last input. You can use any of the supplied tools any number of "
    "times, but you should aim to execute the minimum number of necessary actions for the "
    "input. You should use the `directly-answer` tool if calling the other tools is "
    "unnecessary. The list of actions you want to call should be formatted as a list of json "
    "objects, for example:\n"
    "```json\n"
    "[\n"
    "    {\n"
    "        \"tool_name\": title of the tool in the specification,\n"
    "        \"parameters\": a dict of parameters to input into the tool as they are defined in "
    "the specs, or {} if it takes no parameters\n"
    "    }\n"
    "]```\n"
    "{{- end }}\n"
    "{{- else if eq .Role \"assistant\" }}<|CHATBOT_TOKEN|>\n"
    "{{- if .Content }}{{ .Content }}\n"
    "{{- else if .ToolCalls }}\n"
    "Action: ```json\n"
    "[\n"
    "{{- range .ToolCalls }}\n"
    "    {\n"
    "        \"tool_name\": \"{{ .Function.Name }}\",\n"
    "        \"parameters\": {{ .Function.Arguments }}\n"
    "    }\n"
    "{{- end }}\n"
    "]```\n"
    "{{- end }}\n"
    "{{- else if eq .Role \"tool\" }}<|SYSTEM_TOKEN|><results>\n"
    "console_output: {{ .Content }}\n"
    "</results>\n"
    "{{- end }}<|END_OF_TURN_TOKEN|>\n"
    "{{- end }}<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n"
)


def test_command_r_tool_call():
    # ollama/ollama template/testdata/command-r.gotmpl/tools-single-call
    call = {"function": {"name": "get_weather", "arguments": {"location": "San Francisco, CA"}}}
    messages = to_go([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert render(COMMAND_R, {"Messages": messages}) == (
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\nAction: ```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n"
        "        \"parameters\": {\"location\":\"San Francisco, CA\"}\n    }\n]```<|END_OF_TURN_TOKEN|>"
        "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n")


def test_command_r_tools_preamble():
    # ollama/ollama template/testdata/command-r.gotmpl/tools-single (properties range in sorted order)
    properties = {"unit": {"type": "string", "description": "The unit of temperature to use"},
                  "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"}}
    tools = to_go([{"type": "function", "function": {
        "name": "get_weather", "description": "Get current weather information for a location",
        "parameters": {"type": "object", "required": ["location", "unit"], "properties": properties}}}])
    assert render(COMMAND_R, {"Messages": [], "Tools": tools}) == (
    "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|># Safety Preamble\n"
    "The instructions in this section override those in the task description and style guide "
    "sections. Don't answer questions that are harmful or immoral.\n"
    "\n"
    "# System Preamble\n"
    "## Basic Rules\n"
    "You are a powerful conversational AI trained by Cohere to help people. You are augmented "
    "by a number of tools, and your job is to use and consume the output of these tools to best "
    "help the user. You will see a conversation history between yourself and a user, ending "
    "with an utterance from the user. You will then see a specific instruction instructing you "
    "what kind of response to generate. When you answer the user's requests, you cite your "
    "sources in your answers, according to those instructions.\n"
    "\n"
    "\n"
    "\n"
    "## Available Tools\n"
    "Here is a list of tools that you have available to you:\n"
    "\n"
    "```python\n"
    "def get_weather(location: string, unit: string, ) -> List[Dict]:\n"
    "    '''Get current weather information for a location\n"
    "\n"
    "    Args:\n"
    "        location (string): The city and state, e.g. San Francisco, CA\n"
    "        unit (string): The unit of temperature to use\n"
    "    '''\n"
    "    pass\n"
    "```<|END_OF_TURN_TOKEN|><|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>\n"
)
