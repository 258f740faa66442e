# Two commands set everything up on a fresh machine:
#   make run    create .venv, install, run a search on the embedded defaults
#   make test   create .venv, install, run the whole test suite
# and for development: make test-fast (no `slow` tests), make lint (ruff + mypy + the docs build, as CI
# runs them), make docs (the documentation site into site/)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python ships only as source. Built portably (AVX2, not -march=native): a native build on a
# CPU that advertises AMX crashed in ggml's CPU backend on its first completion (a VM without the AMX
# state). The wheel is kept per version and flags, so the ~6-10 min compile happens once per machine
# (pip's own wheel cache ignores CMAKE_ARGS, so it could hand back a build with other flags).
LLAMA_PIN := $(shell grep -o 'llama-cpp-python\[server\]==[0-9.]*' pyproject.toml | sed 's/\[server\]//')
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_WHEELS := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nasflow/wheels/$(shell printf '%s %s' '$(LLAMA_PIN)' '$(LLAMA_CMAKE)' | sha256sum | cut -c1-16)

.PHONY: install run test test-fast lint docs bench clean

$(STAMP): pyproject.toml Makefile
	@echo "install 1/4: a virtual environment in $(VENV)"
	@$(PY) -m venv $(VENV)
	@$(BIN)/pip install --quiet --upgrade pip
	@if ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "install 2/4: llama.cpp for the embedded model: the wheel built earlier ($(LLAMA_WHEELS))"; \
	else \
	  echo "install 2/4: llama.cpp for the embedded model: $(LLAMA_PIN) compiles from source (~6-10 min on 2 cores, once per machine)"; \
	  rm -rf $(LLAMA_WHEELS).part && mkdir -p $(LLAMA_WHEELS).part && \
	  ( while sleep 60; do echo "  ... still compiling llama.cpp ($$(date +%H:%M:%S))"; done ) & beat=$$!; \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/pip wheel --quiet --no-deps --no-cache-dir '$(LLAMA_PIN)' -w $(LLAMA_WHEELS).part; \
	  status=$$?; kill $$beat; [ $$status -eq 0 ] || exit $$status; \
	  rm -rf $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).part $(LLAMA_WHEELS); \
	fi
	@echo "install 3/4: nasflow and its dependencies (torch, Prefect, Qdrant, ...; ~2 min from PyPI)"
	@# forced: a .venv from before may hold the same version built with other flags
	@$(BIN)/pip install --quiet --no-compile --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	@# quiet: setuptools boxes a warning about working-directory folders named like the package; here
	@# they are the package (the checkout), so that one module's warnings are filtered, nothing else
	@PYTHONWARNINGS="ignore:::setuptools.command.editable_wheel" \
	  $(BIN)/pip install --quiet --no-compile --find-links $(LLAMA_WHEELS) -e '.[test]'
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
	$(BIN)/python benchmarks/graph_information.py
	$(BIN)/python benchmarks/op_costs.py
	$(BIN)/python benchmarks/fuzz.py
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) runs multirun
