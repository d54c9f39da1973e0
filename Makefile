# Two commands on a fresh machine: `make demo` (set up + run the offline demo pipeline)
# and `make test` (set up + run the tests). Everything else is optional.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The CPU build of torch. Off this machine, point pip at PyTorch's CPU index, e.g.
#   make demo TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# (a GPU machine installs its CUDA build of torch 2.13.0 the same way).
TORCH_PIP_ARGS ?=
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export DVC_NO_ANALYTICS ?= 1

.PHONY: setup demo multi30k test test-fast results lock help

help:
	@echo "make demo   - install into $(VENV) and run the offline demo pipeline (dvc repro)"
	@echo "make test   - install into $(VENV) and run the whole test suite (the 15 slowest listed)"
	@echo "make test-fast - the tests not marked slow (no Prefect server, torchrun or end-to-end run)"
	@echo "make multi30k - the multi30k-en-de preset: real Multi30k, 60 minutes of training"
	@echo "make setup  - only install (the tested versions, from requirements.lock)"
	@echo "make results - every experiment, one line each: recipe, BLEU, steps, time, champion, decisions"
	@echo "make lock   - re-resolve the newest versions pyproject.toml allows into requirements.lock"

# requirements.lock: the versions the tests passed with (pip constraints: pyproject.toml's
# ranges say what may work, the lock what did). `make lock` refreshes it; then `make test`.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned, so nothing later can pull a CUDA build as a dependency.
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[dev]'
	touch $@

setup: $(STAMP)

demo: setup
	$(BIN)/python -m transformer.config check
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc metrics show data/metrics/evaluate.json

# jemalloc where installed (apt-get install libjemalloc2): glibc's heap fragments over an hour
# of varying batch shapes (README, "Multi30k on a 2-core CPU")
JEMALLOC := $(firstword $(wildcard /usr/lib/*-linux-gnu/libjemalloc.so.2))

multi30k: setup
	@test -n "$(JEMALLOC)" || echo "warning: no libjemalloc.so.2; glibc malloc slows long runs"
	$(BIN)/python -m transformer.config preset multi30k-en-de
	PATH=$(abspath $(BIN)):$$PATH LD_PRELOAD=$(JEMALLOC) $(BIN)/dvc repro
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc metrics show data/metrics/evaluate.json

# pytest's output ends with the 15 slowest tests and the suite's count and time (what CI shows).
# Two pytest-xdist workers: the real-server tests wait on processes about half the time, so two
# at once fill both cores (docs/experiments/2026-11-27-test-suite-time.md); tests that share a
# module's fixture run on one worker (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q --durations=15 \
	  -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test-fast: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest -q -m "not slow" --durations=15

results: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.results

# The newest versions pyproject.toml allows, resolved in a scratch venv and frozen (without the
# project itself; torch as the plain 2.13.0 every build of it satisfies).
LOCK_VENV := $(VENV)-lock
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(LOCK_VENV)/bin/python -m pip install -q -e '.[dev]'
	{ echo "# The tested versions: make setup installs with these constraints. Refresh: make lock"; \
	  echo "# (then make test). Made with $$($(LOCK_VENV)/bin/python -V) on $$(uname -sm)."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed 's/^torch==.*/torch==2.13.0/'; \
	} > requirements.lock.tmp
	mv requirements.lock.tmp requirements.lock
	rm -rf $(LOCK_VENV)
