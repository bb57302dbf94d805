"""Model metadata both sides read: GGUF key/values, end-of-generation ids and chat templates.

``gguf_value(reader, key)`` reads one metadata value of a parsed GGUF (``GGUFFile`` or
``gguf.GGUFReader``); ``gguf_eos_token_ids`` / ``hf_eos_token_ids`` give the ids that end a
generation (the primary EOS first); ``hf_chat_template`` the Jinja template of a Hugging Face
checkpoint directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import GGUFReader

# Token texts llama.cpp treats as end-of-generation whatever the metadata says (llama-vocab.cpp).
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
        "<EOT>", "_<EOT>", "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
    }
)  # fmt: skip


def gguf_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as a Python object (str, number, bool or list), or ``default``."""
    field_ = reader.fields.get(key)
    return default if field_ is None else field_.contents()


def ordered_eos(primary: int | None, others: list[int]) -> list[int]:
    """The primary EOS first, then the other ids ascending, without duplicates."""
    head = [] if primary is None else [primary]
    return head + sorted(set(others) - set(head))


def gguf_eos_token_ids(reader: GGUFReader, tokens: list[str]) -> list[int]:
    """tokenizer.ggml.eos/eot/eom ids plus the tokens llama.cpp treats as end-of-generation by text."""
    ids = [gguf_value(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    ids += [i for i, text in enumerate(tokens) if text in EOG_TEXTS]
    return ordered_eos(gguf_value(reader, "tokenizer.ggml.eos_token_id"), [i for i in ids if i is not None])


def hf_eos_token_ids(root: Path, config: dict[str, Any]) -> list[int]:
    """config.json eos_token_id (first is primary) plus generation_config.json's."""
    ids = _as_list(config.get("eos_token_id"))
    gen_path = root / "generation_config.json"
    extra = _as_list(read_json(gen_path).get("eos_token_id")) if gen_path.exists() else []
    primary = ids[0] if ids else (extra[0] if extra else None)
    return ordered_eos(primary, ids + extra)


def hf_chat_template(root: Path) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tok_config = root / "tokenizer_config.json"
    template = read_json(tok_config).get("chat_template") if tok_config.exists() else None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    return template


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _as_list(value: int | list[int] | None) -> list[int]:
    return [] if value is None else [value] if isinstance(value, int) else list(value)
