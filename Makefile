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

# Tests run on every core (pytest-xdist), one test file per worker at a time, so a module's
# fixtures (the trained pair's captures, converted files) are built once; files are handed out in
# the order tests/conftest.py collects them (the longest first).
JOBS ?= auto
XDIST := -n $(JOBS) --dist loadfile --no-loadscope-reorder
# Tests keep their compiled bytecode (in __pycache__, ignored by git) even where the environment
# says PYTHONDONTWRITEBYTECODE: without it every worker re-runs pytest's assertion rewriting of
# every test module (~8 s a worker) and every command-line child compiles the package afresh.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

# Every tier: unit, bad input, parity with llama.cpp's converter, llama.cpp runtime, the trained
# pair. Prints the 30 slowest tests.
test: venv lint
	$(PYTEST) -q -ra $(XDIST) --durations=30

# Unit and bad-input tiers: no llama.cpp (no sdist download, no cmake build) and no trained pair.
# DFLASH_CONVERT_FAST_TIER makes a test that reaches for either fail, naming the mark it lacks.
# Tests are handed out one at a time (worksteal): the tier has no costly module fixture to share,
# and the largest file would otherwise keep one worker busy alone.
test-fast: venv
	DFLASH_CONVERT_FAST_TIER=1 $(PYTEST) -q -ra -n $(JOBS) --dist worksteal -m "not parity and not runtime and not slow" --durations=20

bench: venv
	$(BIN)/python bench/bench_convert.py

clean:
	rm -rf $(VENV) demo .pytest_cache
