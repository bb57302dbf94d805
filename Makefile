# Everything installs into .venv on first use; `make test` works on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-slow test-all demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)  ## the default suite (slow tests excluded)
	$(BIN)/python -m pytest -m "not slow and not gpu" $(PYTEST_ARGS)

test-slow: $(STAMP)  ## the slow tests only (CI runs them after make test)
	$(BIN)/python -m pytest -m "slow and not gpu" $(PYTEST_ARGS)

test-all: $(STAMP)  ## everything that can run here, slow tests included
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

demo: $(STAMP)  ## offline end-to-end: build, create, push, pull, run, serve, openai client, curl, usage
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

bench: $(STAMP)  ## benchmarks; each prints ratios against its reference
	$(BIN)/python bench/pull.py
	$(BIN)/python bench/gateway.py --runs 5
	$(BIN)/python bench/native.py --json .bench/native/results.json
	$(BIN)/python bench/native_load.py --json .bench/native/load.json
	$(BIN)/python bench/remote.py --json .bench/remote/results.json
	$(BIN)/python bench/estimate_check.py --json .bench/estimate/results.json
	$(BIN)/python bench/gateway_overhead.py --json .bench/gateway_overhead/results.json
	$(BIN)/python bench/gateway_overhead.py --soak --json .bench/gateway_overhead/soak.json
	$(BIN)/python bench/slo.py --json .bench/slo/results.json
	$(BIN)/python bench/slo_sim.py
	$(BIN)/python bench/slo_oracle.py --loads 0.5,0.9 --seeds 13 --restarts 12
	$(BIN)/python bench/dashboard.py --json .bench/dashboard/results.json
	$(BIN)/python bench/compare_accuracy.py --smollm2 --json .bench/compare/results.json

clean:
	rm -rf .demo .bench .pytest_cache
