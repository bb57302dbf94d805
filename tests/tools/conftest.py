"""A live ``infer serve`` over the tiny test model installed under tool-capable templates.

- ``qwen-tools``: Ollama's qwen2.5 template (calls inside ``<tool_call>`` tags);
- ``llama-tools``: Ollama's llama3.1 template (bare JSON calls);
- ``tiny`` / ``tiny-go``: templates without tools (the 400 case).

The weights are random, so a call comes out of the model only where the output is steered: a forced
``tool_choice`` (a JSON grammar) or an Ollama ``format`` schema shaped like a Llama call.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from registry.create import create_model
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from fakes.live import LiveServer, start_server, stop_server
from tests.gateway.conftest import private_store
from tests.tools.templates import LLAMA31, QWEN25

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def install_tool_models(store, gguf) -> None:
    models = {"qwen-tools": (QWEN25, ["<|im_start|>", "<|im_end|>"]),
              "llama-tools": (LLAMA31, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])}
    for name, (template, stops) in models.items():
        lines = [f"FROM {gguf}", "PARAMETER num_ctx 1024", *(f'PARAMETER stop "{s}"' for s in stops),
                 f'TEMPLATE """{template}"""']
        modelfile = parse_modelfile("\n".join(lines) + "\n")
        create_model(store, parse_name(name, insecure=True), modelfile, gguf.parent)


@pytest.fixture(scope="module")
def tools_server(tiny_store, tmp_path_factory) -> Iterator[LiveServer]:
    store = private_store(tiny_store, tmp_path_factory, "tools-models")
    install_tool_models(store, tiny_store.root.parent / "tiny-qwen2.gguf")
    server = start_server(tmp_path_factory.mktemp("tools-live"), store.root)
    try:
        yield server
    finally:
        stop_server(server)
