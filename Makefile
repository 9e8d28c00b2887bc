# Set-up and test commands for a fresh machine. torch is installed first, pinned to the CPU
# build that lies on local disk here (an unpinned install would pull a multi-GB CUDA build).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: venv demo test test-fast lint bench clean

$(BIN)/dflash-convert: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/dflash-convert

demo: venv
	$(BIN)/python -m fixtures.demo demo

lint: venv
	$(BIN)/ruff check dflash_convert fixtures tests bench

# Every tier: unit, bad input, parity with llama.cpp's converter, llama.cpp runtime.
test: venv lint
	$(BIN)/python -m pytest -q -ra --durations=30

# Without the llama.cpp tiers (no sdist download, no cmake build).
test-fast: venv
	$(BIN)/python -m pytest -q -m "not parity and not runtime"

bench: venv
	$(BIN)/python bench/bench_convert.py

clean:
	rm -rf $(VENV) demo .pytest_cache
