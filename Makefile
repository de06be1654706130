# The two commands a newcomer types: `make demo` and `make test`. Each creates the
# virtualenv on first use, installing the CPU build of torch first (an unpinned torch would
# pull a multi-GB CUDA build) and then runwatch with its test extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-runwatch

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/runwatch demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/runwatch bench all

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
