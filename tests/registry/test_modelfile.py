import pytest

from registry.errors import ModelfileError
from registry.modelfile import parse_modelfile, render_modelfile

EXAMPLE = '''# a comment
FROM qwen2:0.5b
PARAMETER temperature 0.7
parameter num_ctx 4096
PARAMETER stop "<|im_end|>"
PARAMETER stop <|im_start|>
SYSTEM """You are a concise assistant."""
TEMPLATE """{{ if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}"""
LICENSE MIT
MESSAGE user Is Toronto in Canada?
MESSAGE assistant yes
'''


def test_parses_every_instruction():
    mf = parse_modelfile(EXAMPLE)
    assert mf.from_ == "qwen2:0.5b"
    assert mf.parameters == {"temperature": 0.7, "num_ctx": 4096, "stop": ["<|im_end|>", "<|im_start|>"]}
    assert mf.system == "You are a concise assistant."
    assert mf.template == "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    assert mf.licenses == ["MIT"]
    assert mf.messages == [{"role": "user", "content": "Is Toronto in Canada?"},
                           {"role": "assistant", "content": "yes"}]


def test_render_round_trips():
    mf = parse_modelfile(EXAMPLE)
    text = render_modelfile(from_=mf.from_, template=mf.template, system=mf.system,
                            parameters=mf.parameters, licenses=mf.licenses, messages=mf.messages)
    assert parse_modelfile(text) == mf


@pytest.mark.parametrize("text, message", [
    ("PARAMETER temperature 0.7\n", "no FROM line"),
    ("FROM x\nFROBNICATE 1\n", "line 2: command must be one of"),
    ("FROM x\nPARAMETER temperature hot\n", "line 2: PARAMETER temperature expects float"),
    ("FROM x\nPARAMETER warp 9\n", "unknown parameter 'warp'"),
    ("FROM x\nMESSAGE robot hi\n", "MESSAGE role must be one of"),
    ('FROM x\nSYSTEM """never closed\n', 'unterminated """'),
])
def test_errors_name_the_line(text, message):
    with pytest.raises(ModelfileError, match=message):
        parse_modelfile(text)
