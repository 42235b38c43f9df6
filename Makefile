# `make score` and `make test` are all a newcomer needs: each sets up on first use, in one .venv.
# `make score` installs only what running a job needs (batchscore, torch, and the extras the jobs
# in jobs/ use); `make test` adds the dev set on top (test, lint and benchmark tools) and
# Chromium for the browser test, without redoing the first install.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Without an NVIDIA GPU, take torch's CPU build (a bare `torch` would pull multi-GB CUDA wheels):
# the pinned CPU wheel where the machine provides it, else PyTorch's CPU index.
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
# The extras the shipped jobs need at run time: embed_images.toml decodes pictures with Pillow
# (images), classify_by_decoder.toml holds answers to its choices with llguidance (structured).
# tests/test_packaging.py checks this list against jobs/*.toml.
JOB_EXTRAS := images,structured
RUNTIME := $(VENV)/.runtime-done
DEV := $(VENV)/.dev-done
DATA := data/docs/.built
# The small models (and data) that jobs/tabular.toml, classify.toml, generate.toml,
# perplexity.toml and embed_images.toml run with, trained (or, the tiny CLIP, built) here in
# seconds; each script's docstring says what its model is and is not.
TABULAR := data/tabular/.built
CLASSIFIER := models/docstring-kind/.built
TOY_GPT := models/toy-gpt2/.built
TINY_CLIP := models/tiny-clip/.built
EXAMPLES := $(TABULAR) $(CLASSIFIER) $(TOY_GPT) $(TINY_CLIP)
# The tabular example's data is scikit-learn's bundled copy (nothing is downloaded): installed
# when that example is first built, not with the runtime
SKLEARN := scikit-learn>=1.3
# Debian's Chromium and its driver, for the report page's browser test (tests/test_report_browser.py)
BROWSER := /usr/bin/chromedriver

.PHONY: setup dev score test soak bench bench-generate bench-peers bench-gpu lint format clean

# What every shipped job reads: the runtime, the sample corpus and the example models
setup: $(RUNTIME) $(DATA) $(EXAMPLES)

# What the tests, the soak, the linter and the benchmarks need: setup, the dev set, Chromium
dev: setup $(DEV) $(BROWSER)

$(RUNTIME): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "setup: NVIDIA GPU found, installing torch with CUDA"; \
	else \
		echo "setup: no GPU, installing the CPU build of torch"; \
		$(BIN)/pip install -q "$(TORCH_CPU)" || \
		$(BIN)/pip install -q torch --index-url $(TORCH_CPU_INDEX); \
	fi
	$(BIN)/pip install -q -e '.[$(JOB_EXTRAS)]'
	touch $@

# On top of the runtime: pip keeps what is installed and adds the rest
$(DEV): $(RUNTIME)
	$(BIN)/pip install -q -e '.[$(JOB_EXTRAS),dev,bench,report]'
	touch $@

# apt-get as root (CI, containers) or through sudo; elsewhere the browser test is skipped
$(BROWSER):
	@if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	else echo "make test: not root and no sudo: install Debian's chromium and chromium-driver" \
		"for the browser test"; exit 0; fi; \
	$$SUDO apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver

$(DATA): scripts/sample_corpus.py $(RUNTIME)
	$(BIN)/python scripts/sample_corpus.py data/docs --shards 8
	touch $@

$(TABULAR): scripts/tabular_example.py $(RUNTIME)
	$(BIN)/pip install -q "$(SKLEARN)"
	$(BIN)/python scripts/tabular_example.py data/tabular models/breast-cancer-mlp.safetensors
	touch $@

$(CLASSIFIER): scripts/classify_example.py $(DATA)
	$(BIN)/python scripts/classify_example.py data/docs models/docstring-kind
	touch $@

$(TOY_GPT): scripts/generate_example.py $(DATA)
	$(BIN)/python scripts/generate_example.py data/docs models/toy-gpt2
	touch $@

$(TINY_CLIP): scripts/images_example.py $(RUNTIME)
	$(BIN)/python scripts/images_example.py data/images models/tiny-clip
	touch $@

# `make score JOB=jobs/embed.toml ARGS="--metrics-file out/embed.prom"` for any job
# It builds the example a shipped job reads on that job's first run, and nothing else.
JOB ?= jobs/summarize.toml
ARGS ?=
EXAMPLE_jobs/tabular.toml := $(TABULAR)
EXAMPLE_jobs/classify.toml := $(CLASSIFIER)
EXAMPLE_jobs/generate.toml := $(TOY_GPT)
EXAMPLE_jobs/perplexity.toml := $(TOY_GPT)
EXAMPLE_jobs/classify_by_decoder.toml := $(TOY_GPT)
EXAMPLE_jobs/embed_images.toml := $(TINY_CLIP)
score: $(RUNTIME) $(DATA) $(EXAMPLE_$(patsubst ./%,%,$(JOB)))
	$(BIN)/batchscore run $(JOB) $(ARGS)

# Two workers, one per core: most tests run the model on one thread, so two side by side halve
# the suite's time (the slowest tests, Ray's and the kills', wait on subprocesses).
test: dev
	$(BIN)/python -m pytest -n 2 --dist worksteal

# 100 SIGKILLs at random moments of one job, then a check against a clean run (several minutes)
soak: dev
	$(BIN)/python -m pytest -m soak tests/test_reliability.py

bench: dev
	$(BIN)/python scripts/bench.py
	$(BIN)/python scripts/bench_cold.py
	$(BIN)/python scripts/bench_startup.py
	$(BIN)/python scripts/bench_shards.py

bench-generate: dev
	$(BIN)/python scripts/generate_bench.py

# The peers, each in its own environment (their pins conflict: optimum-onnx needs transformers
# < 4.58, optimum-intel < 5.6), every package pinned in scripts/peers/NAME.txt and installed
# without resolving, after the same CPU torch. Then every variant side by side (about half an
# hour): `make bench-peers ARGS="--rows 300 --repeats 3"` for a quick look.
PEERS := .bench/peers
PEER_ENVS := $(foreach peer,torch onnx openvino,$(PEERS)/$(peer)/.built)

$(PEERS)/%/.built: scripts/peers/%.txt
	rm -rf $(PEERS)/$*
	$(PYTHON) -m venv $(PEERS)/$*
	$(PEERS)/$*/bin/pip install -q "$(TORCH_CPU)" || \
		$(PEERS)/$*/bin/pip install -q torch --index-url $(TORCH_CPU_INDEX)
	$(PEERS)/$*/bin/pip install -q --no-deps -r $<
	touch $@

bench-peers: dev $(PEER_ENVS)
	$(BIN)/python scripts/bench_peers.py $(ARGS)

# On a CUDA machine: the GPU tests, then one table (<= 6 minutes on one GPU; BENCHMARKS.md "GPU").
# `python scripts/bench_gpu.py --smoke` runs the same on a CPU in a minute or two.
bench-gpu: dev
	$(BIN)/python -m pytest -m gpu -q
	$(BIN)/python scripts/bench_gpu.py

lint: $(DEV)
	$(BIN)/ruff check batchscore tests scripts docs
	$(BIN)/ruff format --check batchscore tests scripts docs

format: $(DEV)
	$(BIN)/ruff check --fix batchscore tests scripts docs
	$(BIN)/ruff format batchscore tests scripts docs

clean:
	rm -rf out data models .pytest_cache
