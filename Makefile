# Quick start: `make demo` (set up, then plan/compile/run/check the bundled model) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo lint test
$(BIN)/nxrt-tvm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(BIN)/nxrt-tvm

demo: setup
	$(BIN)/nxrt-tvm run --check

lint: setup
	$(BIN)/ruff check nxrt_tvm tests benchmarks tools
	$(BIN)/ruff format --check nxrt_tvm tests benchmarks tools
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q
