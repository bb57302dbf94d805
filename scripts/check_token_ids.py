"""Does the gateway's tokenizer give llama.cpp's ids? Each model's prompts, rendered by its own template,
tokenized by ``frontend/prompt_ids`` (``gguf_io``, the native engine's tokenizer) and by llama.cpp
(``llama_cpp.Llama(vocab_only=True)``, with the BOS rule of ``adapters/engines/llamacpp/job.py``).

    .venv/bin/python scripts/check_token_ids.py --store ~/.infer/models        # every model of a store
    .venv/bin/python scripts/check_token_ids.py model.gguf other.gguf          # GGUF files (their Jinja template)

Prints, per model, how many prompts gave the same ids, and the first difference of each that did not;
exits 1 when any differed. A llama.cpp runner can take the gateway's ids for a model only where all match.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.base import GenerationRequest  # noqa: E402
from frontend.chat_format import PromptSpec, render_request  # noqa: E402
from frontend.prompt_ids import encode, prompt_spec, vocabulary  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Write a haiku about 🌊 and 日本."}],
    [{"role": "user", "content": "code:\n\tdef f(x):\n        return x ** 2  # ok\r\n\n\n"}],
    [{"role": "user", "content": "  spaces  and café naïve résumé, 1234567 digits, I'm sure they've"}],
]
RAW = ["Hello world", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "", " ", "\n\n", "a\u200bb"]


def requests() -> list[GenerationRequest]:
    made = [GenerationRequest(model="m", messages=chat) for chat in CHATS]
    made.append(GenerationRequest(model="m", messages=CHATS[1], tools=TOOLS))
    made.append(GenerationRequest(model="m", prompt="Complete this: the quick brown", templated=True))
    made += [GenerationRequest(model="m", prompt=text, raw=True) for text in RAW]
    return made


def llama_cpp_ids(llm, spec: PromptSpec, text: str) -> list[int]:
    add_bos = llm._model.add_bos_token() and not (spec.bos_token and text.startswith(spec.bos_token))  # noqa: SLF001
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)


def check(name: str, details) -> bool:
    import llama_cpp

    path = str(details.model_path)
    vocab = vocabulary(path)
    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    spec = prompt_spec(details, vocab)
    same, differences = 0, []
    for request in requests():
        try:
            text, _ = render_request(spec, request, lambda t: 0, 1 << 30)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render this request: not a token question
            differences.append(f"  (not rendered: {exc})")
            continue
        ours, theirs = encode(vocab, spec, text), llama_cpp_ids(llm, spec, text)
        if ours == theirs:
            same += 1
        else:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            differences.append(f"  {text[:60]!r}: first difference at token {at}: ours {ours[at:at + 4]} "
                               f"llama.cpp {theirs[at:at + 4]}")
    total = same + len(differences)
    print(f"{name}: {same}/{total} prompts give the same ids")
    for line in differences:
        print(line)
    return not differences


def store_models(root: Path) -> list[tuple[str, object]]:
    from registry.details import details_cache
    from registry.store import Store

    store = Store(root)
    found = [(m.name.display, details_cache.get(store, m.name)) for m in store.list_models()]
    return [(name, details) for name, details in found if details.model_path is not None and details.gguf]


def gguf_model(path: Path):
    from gguf_io.tokenizer import Tokenizer

    template = Tokenizer.from_gguf(str(path)).chat_template
    gguf = SimpleNamespace(chat_template=template)
    return (path.name, SimpleNamespace(model_path=path, gguf=gguf, template=None, system=None, messages=[]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="*", type=Path)
    parser.add_argument("--store", type=Path)
    args = parser.parse_args()
    models = [gguf_model(path) for path in args.gguf] + (store_models(args.store) if args.store else [])
    results = [check(name, details) for name, details in models]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
