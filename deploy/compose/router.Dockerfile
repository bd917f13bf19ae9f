# SGLang's model gateway (the sglang-router wheel from PyPI: a Rust binary inside a Python
# package, prebuilt for Linux x86_64 and aarch64, so no Rust toolchain here), for
# docker-compose.replicas.yml. The version is the one the tests and benchmark ran.
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install sglang-router==0.3.2
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin router
USER 10001
EXPOSE 30000 29000
ENTRYPOINT ["python", "-m", "sglang_router.launch_router"]
