# Two commands on a fresh clone:  `make run` (set up, then simulate the built-in default)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test run teach test lint clean

# what `ferry run` needs, nothing more (no PyTorch: only `ferry calibrate` and `ferry validate` run real kernels)
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $@

# the tests also run the calibration and the real executor on the CPU: PyTorch (the CPU build 2.13.0 where this
# machine has it on disk) and the dev tools
setup-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,calibrate,dask,serve]'
	touch $@

# The main job: llama-3-8b on one H100 SXM as a default `vllm serve` would run it (chunked prefill, the limits vLLM
# picks on that GPU), 1000 requests at 8 req/s.
run: setup
	$(BIN)/ferry run --model llama-3-8b --hardware h100-sxm --policy chunked --request-rate 8 --num-prompts 1000 \
	  --input-len 1024 --output-len 256 --out results/

# The teaching figures (docs/teaching.md): every policy on the chapter's scenarios, English labels (TEACH_LANG=ko: Korean).
teach: setup
	$(BIN)/ferry teach --out figures/ --lang $(or $(TEACH_LANG),en)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy sim policies costmodel experiments

test: setup-test lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) results figures .pytest_cache .mypy_cache .ruff_cache .hypothesis
