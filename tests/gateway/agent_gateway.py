"""One live ``infer serve`` for the agent APIs' tests (Anthropic Messages, OpenAI Responses, thinking).

It serves, over a private copy of the tiny store:

- ``tiny`` (Jinja template, context 512) and the tool-capable ``qwen-tools`` (Ollama's qwen2.5 template)
  on llama.cpp, where a forced ``tool_choice`` makes the random weights call a tool (JSON grammar);
- ``agent-tools``: ``qwen-tools`` with an 8k context, for a Claude Code-sized request;
- ``think-r1``: a ChatML template whose generation prompt opens ``<think>`` when asked to think (as
  DeepSeek-R1's does), so a local model's whole output is thinking;
- ``remote-agent``: a vLLM-typed remote backend on the loopback fake of ``agent_fake.py`` (reasoning
  and tool calls), priced at list prices so rows carry costs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from registry.create import create_model
from registry.modelfile import parse_modelfile
from registry.names import parse_name
from tests.gateway.agent_fake import agent_app
from fakes.live import LiveServer, start_server, stop_server
from tests.gateway.conftest import private_store
from fakes.behaviour import Behaviour
from fakes.runner import RunningServer
from tests.tools.templates import QWEN25

THINK_TEMPLATE = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ if .Think }}<think>
{{ end }}"""
PRICES = {"input_per_mtok": 1.0, "output_per_mtok": 10.0}


def _install(store, gguf) -> None:
    from tests.tools.conftest import install_tool_models  # here: tests/tools/conftest imports this package's

    install_tool_models(store, gguf)
    models = {"agent-tools": (QWEN25, 8192, ["<|im_start|>", "<|im_end|>"]),
              "think-r1": (THINK_TEMPLATE, 512, ["<|im_end|>"])}
    for name, (template, ctx, stops) in models.items():
        lines = [f"FROM {gguf}", f"PARAMETER num_ctx {ctx}", *(f'PARAMETER stop "{s}"' for s in stops),
                 f'TEMPLATE """{template}"""']
        create_model(store, parse_name(name, insecure=True), parse_modelfile("\n".join(lines) + "\n"), gguf.parent)


class AgentGateway:
    def __init__(self, server: LiveServer, fake: RunningServer, received: list[dict]):
        self.server, self.fake, self.received = server, fake, received
        self.url = server.url


@pytest.fixture(scope="session")
def agent_gateway(tiny_store, tmp_path_factory) -> Iterator[AgentGateway]:
    store = private_store(tiny_store, tmp_path_factory, "agent-models")
    _install(store, tiny_store.root.parent / "tiny-qwen2.gguf")
    received: list[dict] = []
    tmp = tmp_path_factory.mktemp("agent-live")
    with RunningServer("vllm", agent_app(received), Behaviour()).start() as fake:
        config = tmp / "backends.yaml"
        config.write_text(yaml.safe_dump({"backends": [
            {"name": "remote-agent", "type": "vllm", "base_url": fake.url, "model": "agent", "pricing": PRICES}]}))
        server = start_server(tmp, store.root, INFER_CONFIG=str(config))
        try:
            yield AgentGateway(server, fake, received)
        finally:
            stop_server(server)
