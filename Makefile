# Two commands do all the set-up on a fresh machine (Python >= 3.10 with venv):
#   make demo   create .venv, install structconv, run `structconv demo`
#   make test   create .venv, install structconv with test extras, run ruff and the test suite
# and `make docs` builds the documentation site into site/ (strict: a warning fails it)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# one environment for both commands: the test extra holds every extra (the demo's included)
$(BIN)/structconv: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that no dependency pulls a CUDA build
	$(BIN)/pip install -q -c constraints.txt torch
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $@

.PHONY: install demo test lint bench docs
install: $(BIN)/structconv

demo: install
	$(BIN)/structconv demo

lint: install
	$(BIN)/ruff check src tests benchmarks

test: install lint
	$(BIN)/python -m pytest

bench: install
	$(BIN)/structconv bench all

# the site: guide, API reference from the docstrings, examples with their output (mkdocs.yml)
docs: install
	$(BIN)/mkdocs build --strict
