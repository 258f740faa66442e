# Two commands set everything up on a fresh machine:
#   make run    create .venv, install, run a search on the embedded defaults
#   make test   create .venv, install, run the whole test suite
# and for development: make test-fast (no `slow` tests), make lint (ruff + mypy + the docs build, as CI
# runs them), make docs (the documentation site into site/)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint docs bench clean

$(STAMP): pyproject.toml
	@echo "install 1/4: a virtual environment in $(VENV)"
	@$(PY) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@echo "install 2/4: dependencies (torch, Prefect, Qdrant, ...; ~2 min from PyPI)"
	@echo "install 3/4: llama-cpp-python builds from source with the C/C++ compiler the first time (~6-10 min on 2 cores; pip caches the wheel, later installs take seconds)"
	@$(BIN)/pip install --quiet --no-compile -e '.[test]'
	@echo "install 4/4: bytecode"
	@# pip compiles the bytecode file by file on one core; compileall uses every core (a file that
	@# does not compile, some packages' templates, is skipped as pip skips it)
	@$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	@touch $(STAMP)
	@echo "install done: $(BIN)/nas"

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
	@# the docs site: generated reference pages included, any warning fails (docs/hooks.py)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $(VENV)/docs-site

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

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
