"""The official ``openai`` Python SDK against a live ``infer serve``.

Usage numbers must be the tokenizer's counts: ``prompt_tokens`` is the length of the rendered prompt
as llama.cpp tokenizes it (computed here independently from the model's GGUF vocabulary and the
project's prompt renderer), ``completion_tokens`` the number of tokens streamed (with ``logprobs``
each content chunk carries its tokens).
"""

from __future__ import annotations

import llama_cpp
import openai
import pytest

from frontend.chat_format import PromptSpec, render_chat, render_generate
from registry.details import load_details

HI = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def client(live_server):
    return openai.OpenAI(base_url=live_server.url + "/v1", api_key="infer", max_retries=0, timeout=60)


class Tokenizer:
    """The model's vocabulary (no weights) and its prompt spec, tokenizing as the backend does."""

    def __init__(self, store, model: str):
        details = load_details(store, store.resolve(model))
        self.vocab = llama_cpp.Llama(str(details.model_path), vocab_only=True, verbose=False)
        bos, eos = (self._special(self.vocab.token_bos()), self._special(self.vocab.token_eos()))
        self.spec = PromptSpec.from_details(details, bos_token=bos, eos_token=eos)

    def _special(self, token: int) -> str:
        return "" if token < 0 else self.vocab.detokenize([token], special=True).decode("utf-8", errors="replace")

    def count(self, text: str) -> int:
        add_bos = self.vocab._model.add_bos_token() and not (self.spec.bos_token
                                                              and text.startswith(self.spec.bos_token))
        return len(self.vocab.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def chat_tokens(self, messages: list[dict]) -> int:
        return self.count(render_chat(self.spec, messages))

    def generate_tokens(self, prompt: str) -> int:
        return self.count(render_generate(self.spec, prompt))


@pytest.fixture(scope="module")
def tokenizers(tiny_store):
    return {name: Tokenizer(tiny_store, name) for name in ("tiny", "tiny-go")}


@pytest.mark.parametrize("model", ["tiny", "tiny-go"])
def test_chat_non_stream_usage_is_the_tokenizer_count(client, tokenizers, model):
    messages = [{"role": "system", "content": "Be brief."}, *HI] if model == "tiny" else HI
    resp = client.chat.completions.create(model=model, messages=messages, max_tokens=10, seed=3, logprobs=True)
    assert resp.object == "chat.completion" and resp.model == model and len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert resp.usage.prompt_tokens == tokenizers[model].chat_tokens(messages)
    assert resp.usage.completion_tokens == len(choice.logprobs.content) <= 10
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_stream_usage_counts_streamed_tokens(client, tokenizers):
    stream = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, seed=4, stream=True,
                                            logprobs=True, top_logprobs=2, stream_options={"include_usage": True})
    chunks = list(stream)
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    assert body[0].choices[0].delta.role == "assistant"
    assert body[-1].choices[0].finish_reason in ("stop", "length")
    streamed = [e for c in body if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert all(len(e.top_logprobs) == 2 for e in streamed)
    assert last.usage.completion_tokens == len(streamed)
    assert last.usage.prompt_tokens == tokenizers["tiny"].chat_tokens(HI)
    text = "".join(c.choices[0].delta.content or "" for c in body)
    again = client.chat.completions.create(model="tiny", messages=HI, max_tokens=12, seed=4)
    assert again.choices[0].message.content == text


def test_completions(client, tokenizers):
    resp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, seed=1, logprobs=1)
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    assert resp.usage.prompt_tokens == tokenizers["tiny"].generate_tokens("Once upon a time")
    assert resp.usage.completion_tokens == len(resp.choices[0].logprobs.tokens) <= 6
    chunks = list(client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, seed=1,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == resp.choices[0].text
    assert chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_models_list_and_retrieve(client):
    ids = [m.id for m in client.models.list()]
    assert "tiny:latest" in ids and "tiny-go:latest" in ids
    model = client.models.retrieve("tiny:latest")
    assert model.id == "tiny:latest" and model.owned_by == "library"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("missing:latest")


def test_embeddings(client, tokenizers):
    texts = ["hello world", "a second, longer input sentence"]
    resp = client.embeddings.create(model="tiny", input=texts)  # the SDK asks for base64 and decodes it
    assert [d.index for d in resp.data] == [0, 1] and len(resp.data[0].embedding) > 8
    vocab = tokenizers["tiny"].vocab
    assert resp.usage.prompt_tokens == sum(len(vocab.tokenize(t.encode())) for t in texts)
    floats = client.embeddings.create(model="tiny", input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(resp.data[0].embedding, rel=1e-5, abs=1e-6)
    short = client.embeddings.create(model="tiny", input=texts[0], dimensions=8)
    assert len(short.data[0].embedding) == 8


def test_sdk_errors(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="missing", messages=HI, max_tokens=2)
    assert missing.value.body["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi " * 800}])
    assert long.value.code == "context_length_exceeded"
    assert client.chat.completions.create(model="tiny", messages=HI, max_tokens=2).choices
