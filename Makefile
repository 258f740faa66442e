# Two commands set everything up on a fresh machine:
#   make run    create .venv, install, run a search on the embedded defaults
#   make test   create .venv, install, run the whole test suite
# and for development: make test-fast (no `slow` tests), make lint (ruff + mypy, as CI runs them)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -e '.[test]'
	@# pip compiles the bytecode file by file on one core; compileall uses every core (a file that
	@# does not compile, some packages' templates, is skipped as pip skips it)
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/nas search

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/search_efficiency.py
	$(BIN)/python benchmarks/cache_rerun.py
	$(BIN)/python benchmarks/arch_throughput.py
	$(BIN)/python benchmarks/train_throughput.py
	$(BIN)/python benchmarks/llm_layer.py
	$(BIN)/python benchmarks/knowledge.py
	$(BIN)/python benchmarks/design_quality.py
	$(BIN)/python benchmarks/collm_nb201.py
	$(BIN)/python benchmarks/supernet_search.py
	$(BIN)/python benchmarks/orchestration.py
	$(BIN)/python benchmarks/isolation.py
	$(BIN)/python benchmarks/graph_literals.py
	$(BIN)/python benchmarks/op_costs.py
	$(BIN)/python benchmarks/fuzz.py
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) runs multirun
