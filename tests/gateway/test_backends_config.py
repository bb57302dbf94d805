"""``infer serve --config``: the file maps onto RemoteSettings, and every mistake names file:line: field."""

from __future__ import annotations

import textwrap

import pytest

from adapters.remote.base import Timeouts
from gateway.backends_config import ConfigError, GatewayConfig, SLOEntry, load_config
from core.settings import SettingsError

VALID = """\
backends:
  - name: qwen-vllm
    type: vllm
    base_url: http://127.0.0.1:8000/v1/
    model: Qwen/Qwen2-0.5B-Instruct
    api_key_env: VLLM_KEY
    timeout: 30
    max_inflight: 8
    tokenizer: tok/tokenizer.json
    context_length: 32768
  - name: llama-tgi
    type: tgi
    base_url: https://tgi.example:8080/
    model: meta-llama/Llama-3.1-8B-Instruct
    mode: messages
    timeout: {connect: 2, first_byte: 20, read: 10, total: 300}
  - name: trt
    type: triton
    base_url: http://triton:8000
routes:
  - name: chat
    backends: [qwen-vllm, llama-tgi, tiny]    # tiny: a model of the local store
    strategy: slo
    slo: {ttft_ms: 500, tpot_ms: 50, e2e_ms: 20000, target: 0.9, window_s: 60}
    shed: true
    first_token_timeout_ms: 1500
    retries: 2
    fallbacks: [cheap]
  - name: cheap
    backends: [trt]
local:
  pricing: {gpu_hourly_usd: 0.10, gpus: 1, output_weight: 4}
"""


def write(tmp_path, text: str, name: str = "backends.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def valid(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    return write(tmp_path, VALID)


def test_valid_config_maps_onto_remote_settings(valid, tmp_path):
    vllm, tgi, triton = load_config(valid).remote_settings({"VLLM_KEY": "sk-1"})
    assert (vllm.name, vllm.type, vllm.base_url, vllm.model) == (
        "qwen-vllm", "vllm", "http://127.0.0.1:8000", "Qwen/Qwen2-0.5B-Instruct")
    assert vllm.api_key == "sk-1"
    assert vllm.timeouts == Timeouts(connect=5.0, first_byte=30.0, read=30.0, total=30.0)  # a number = total
    assert (vllm.max_inflight, vllm.context_length) == (8, 32768)
    assert vllm.tokenizer == str(tmp_path / "tok" / "tokenizer.json")  # relative to the config file
    assert tgi.base_url == "https://tgi.example:8080" and tgi.mode == "messages" and tgi.api_key is None
    chat, cheap = load_config(valid).routes
    assert (chat.name, chat.backends, chat.strategy, chat.shed, chat.retries, chat.fallbacks) == (
        "chat", ["qwen-vllm", "llama-tgi", "tiny"], "slo", True, 2, ["cheap"])
    assert (chat.slo.ttft_ms, chat.slo.tpot_ms, chat.slo.target, chat.first_token_timeout_ms) == (500, 50, 0.9, 1500)
    assert (cheap.strategy, cheap.slo, cheap.retries) == ("slo", SLOEntry(), 1)  # every key but name/backends optional
    (local,) = load_config(valid).priced()
    assert local.members == ("llamacpp", "native", "tiny") and local.entry.gpu_hourly_usd == 0.10  # tiny: a store model
    assert (local.output_weight, local.weight_source) == (4, "configured")
    assert tgi.timeouts == Timeouts(connect=2, first_byte=20, read=10, total=300)
    assert (triton.model, triton.timeouts, triton.max_inflight, triton.mode) == ("ensemble", Timeouts(), None, None)


def test_partial_timeout_mapping_keeps_the_other_defaults(tmp_path):
    path = write(tmp_path, """\
        backends:
          - {name: a, type: openai, base_url: "http://h:1/v1", model: m, timeout: {total: 9}}
        """)
    (a,) = load_config(path).remote_settings({})
    assert a.base_url == "http://h:1"
    assert a.timeouts == Timeouts(total=9)


def test_config_error_is_a_settings_error_and_a_value_error(tmp_path):
    assert issubclass(ConfigError, SettingsError) and issubclass(ConfigError, ValueError)  # the CLI prints one line


ENTRY = """\
backends:
  - name: a
    type: vllm
    base_url: http://h:1
    model: m
"""

ERRORS = {
    "bad type": (ENTRY + "  - name: b\n    type: vlm\n    base_url: http://h:2\n",
                 ("backends.yaml:7: backends[1].type: unknown type 'vlm' (choose one of vllm, tgi, trtllm, triton, "
                  "ollama, llamacpp, openai)")),
    "missing base_url": (ENTRY + "  - name: b\n    type: tgi\n    model: m\n",
                         "backends.yaml:6: backends[1].base_url: required field is missing"),
    "max_inflight 0": (ENTRY + "    max_inflight: 0\n",
                       "backends.yaml:6: backends[0].max_inflight: Input should be greater than or equal to 1"),
    "unknown key": (ENTRY + "    api_key: sk-oops\n",
                    "backends.yaml:6: backends[0].api_key: unknown key (did you mean 'api_key_env'?)"),
    "unknown top-level key": (ENTRY + "router: {}\n", "backends.yaml:6: router: unknown key"),
    "unknown timeout key": (ENTRY + "    timeout:\n      connect: 1\n      reed: 3\n",
                            "backends.yaml:8: backends[0].timeout.reed: unknown key (did you mean 'read'?)"),
    "non-positive timeout": (ENTRY + "    timeout: 0\n",
                             "backends.yaml:6: backends[0].timeout: Input should be greater than 0"),
    "timeout of the wrong kind": (ENTRY + "    timeout: soon\n",
                                  "backends.yaml:6: backends[0].timeout: expected seconds or a mapping"),
    "duplicate name": (ENTRY + "  - name: b\n    type: tgi\n    base_url: http://h:2\n    model: m\n"
                       "  - name: a\n    type: tgi\n    base_url: http://h:3\n    model: m\n",
                       "backends.yaml:10: backends[2].name: duplicate name 'a' (backends[0] has it too)"),
    "yaml syntax": ("backends:\n  - name: a\n   type: tgi\n", "backends.yaml:3: invalid YAML: expected <block end>"),
    "/v1 on tgi": ("backends:\n  - name: a\n    type: tgi\n    base_url: http://h:1/v1\n    model: m\n",
                   "backends.yaml:4: backends[0].base_url: give the server root for type tgi, without /v1"),
    "not a url": ("backends:\n  - name: a\n    type: tgi\n    base_url: h:1\n    model: m\n",
                  "backends.yaml:4: backends[0].base_url: 'h:1' is not an http(s) URL"),
    "missing model": ("backends:\n  - name: a\n    type: vllm\n    base_url: http://h:1\n",
                      "backends.yaml:2: backends[0].model: required for type vllm"),
    "mode on vllm": (ENTRY + "    mode: messages\n",
                     "backends.yaml:6: backends[0].mode: only the tgi type has a mode (this entry is vllm)"),
    "name with a space": (ENTRY.replace("name: a", "name: my model"),
                          "backends.yaml:2: backends[0].name: must be a non-empty name without spaces"),
    "missing tokenizer": (ENTRY + "    tokenizer: nope.json\n",
                          "backends.yaml:6: backends[0].tokenizer: tokenizer file "),
    "no backends": ("routes: []\n", "backends.yaml: the file needs a 'backends:' or a 'routes:' list"),
    "empty backends": ("backends: []\n", "backends.yaml: the file needs a 'backends:' or a 'routes:' list"),
    "unknown strategy": (ENTRY + "routes:\n  - name: r\n    backends: [a]\n    strategy: fastest\n",
                         "backends.yaml:9: routes[0].strategy: Input should be 'slo', 'least_inflight'"),
    "slo typo": (ENTRY + "routes:\n  - name: r\n    backends: [a]\n    slo: {ttft: 500}\n",
                 "backends.yaml:9: routes[0].slo.ttft: unknown key (did you mean 'ttft_ms'?)"),
    "route named like a backend": (ENTRY + "routes:\n  - name: a\n    backends: [a]\n",
                                   "backends.yaml:7: routes[0].name: 'a' is already a backend's name"),
    "unknown fallback": (ENTRY + "routes:\n  - name: r\n    backends: [a]\n    fallbacks: [nope]\n",
                         "backends.yaml:9: routes[0].fallbacks[0]: 'nope' is not another route of this file"),
    "half a list price": (ENTRY + "    pricing: {input_per_mtok: 0.15}\n",
                          "backends.yaml:6: backends[0].pricing: list prices need both input_per_mtok and output_per_mtok"),
    "both pricing forms": (ENTRY + "    pricing: {input_per_mtok: 1, output_per_mtok: 2, gpu_hourly_usd: 2}\n",
                           "backends.yaml:6: backends[0].pricing: give list prices (input_per_mtok, output_per_mtok)"),
    "route without backends": (ENTRY + "routes:\n  - name: r\n    backends: []\n",
                               "backends.yaml:8: routes[0].backends: the list is empty; add at least one backend, "
                               "or prefill: and decode: pools"),
    "prefill pool without a decode pool": (
        ENTRY + "routes:\n  - name: r\n    backends: [a]\n    prefill: {protocol: vllm, backends: [a]}\n",
        "backends.yaml:7: routes[0]: a prefill pool needs a decode pool and back: add decode:"),
    "pools of two protocols": (
        ENTRY + "routes:\n  - name: r\n    prefill: {protocol: vllm, backends: [a]}\n"
                "    decode: {protocol: sglang, backends: [a]}\n",
        "backends.yaml:9: routes[0].decode.protocol: 'sglang' differs from the prefill pool's 'vllm'"),
    "a pool member that is not OpenAI-compatible": (
        ENTRY + "  - name: t\n    type: tgi\n    base_url: http://h:2\n    model: m\nroutes:\n  - name: r\n"
                "    prefill: {protocol: vllm, backends: [t]}\n    decode: {protocol: vllm, backends: [a]}\n",
        "backends.yaml:12: routes[0].prefill.backends[0]: 't' is a tgi backend; a P/D pool takes OpenAI-compatible"),
    "a pool member that is a model of the store": (
        ENTRY + "routes:\n  - name: r\n    prefill: {protocol: vllm, backends: [tiny]}\n"
                "    decode: {protocol: vllm, backends: [a]}\n",
        "backends.yaml:8: routes[0].prefill.backends[0]: 'tiny' is not a backend of this file; a P/D pool takes"),
    "unknown disagg policy": (
        ENTRY + "routes:\n  - name: r\n    backends: [a]\n    disagg: {when: sometimes}\n",
        "backends.yaml:9: routes[0].disagg.when: Input should be 'always', 'long' or 'slo'"),
    "kv events without a tokenizer": (ENTRY + "    kv_events: tcp://h:5557\n",
                                      "backends.yaml:6: backends[0].kv_events: needs tokenizer: (the backend's "),
    "kv events not zmq": (ENTRY + "    kv_events: http://h:5557\n",
                          "backends.yaml:6: backends[0].kv_events: 'http://h:5557' is not a ZMQ endpoint"),
    "prefix typo": (ENTRY + "routes:\n  - name: r\n    backends: [a]\n    strategy: prefix\n    prefix: {load_slak: 2}\n",
                    "backends.yaml:10: routes[0].prefix.load_slak: unknown key (did you mean 'load_slack'?)"),
    "prefix load factor below 1": (ENTRY + "routes:\n  - name: r\n    backends: [a]\n    prefix: {load_factor: 0.5}\n",
                                   "backends.yaml:9: routes[0].prefix.load_factor: Input should be greater than or equal to 1"),
    "empty file": ("", "backends.yaml: the file is empty; it needs a 'backends:' list"),
    "top level list": ("- name: a\n", "backends.yaml:1: the top level must be a mapping"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_each_error_names_file_line_and_field(tmp_path, monkeypatch, case):
    text, expected = ERRORS[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "backends.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config("backends.yaml")
    assert str(info.value).startswith(expected), str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("env, state", [({}, "is not set"), ({"VLLM_KEY": ""}, "is empty")])
def test_missing_api_key_env_names_file_line_and_field(valid, env, state):
    config = load_config(valid)
    with pytest.raises(ConfigError, match=rf"backends.yaml:6: backends\[0\].api_key_env: environment variable "
                                          rf"VLLM_KEY {state}"):
        config.remote_settings(env)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^config file .*nope.yaml not found$"):
        load_config(tmp_path / "nope.yaml")


def test_config_built_in_code_validates_too():
    config = GatewayConfig.model_validate({"backends": [{"name": "a", "type": "triton", "base_url": "http://h"}]})
    assert config.remote_settings({})[0].model == "ensemble"
