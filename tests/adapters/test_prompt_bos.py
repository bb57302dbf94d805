"""The frontend tokenizes a rendered prompt the way llama.cpp does (BOS handling)."""

from dataclasses import dataclass

from frontend.chat_format import PromptSpec
from frontend.prompt_ids import encode


@dataclass
class FakeTokenizer:
    add_bos_token: bool

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        return ([1] if add_bos else []) + [ord(c) for c in text]


def test_bos_is_added_only_when_the_model_wants_it_and_the_template_did_not_write_it():
    spec = PromptSpec(bos_token="<s>")
    assert encode(FakeTokenizer(True), spec, "hi")[0] == 1
    assert encode(FakeTokenizer(True), spec, "<s>hi")[0] == ord("<")
    assert encode(FakeTokenizer(False), spec, "hi")[0] == ord("h")
