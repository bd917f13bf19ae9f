"""The llama.cpp baseline against the real llama-server, when `make bench-peers` has
built it into the peers cache.

Without the binary this module is marked `slow`, so `make test` leaves it out rather
than counting a skip as a pass; `make test-slow` then fails here with the message that
says to run `make bench-peers`.
"""

from __future__ import annotations

import math

import pytest

from bench.harness import metrics
from bench.harness.runner import ClientSettings
from bench.harness.workload import random_requests
from bench.peers import llama_server, llamacpp

# llama-server and a cbserve stack are processes on the model; without the binary, slow.
pytestmark = [pytest.mark.process, pytest.mark.model]
if not llama_server.binary_path():
    pytestmark.append(pytest.mark.slow)

OUTPUT_TOKENS = (6, 12)


def test_llama_server_is_built():
    assert llama_server.binary_path() is not None, llama_server.MISSING


@pytest.mark.timeout(300)
def test_every_request_streams_exactly_its_tokens(model_dir, tokenizer, tmp_path):
    vocab = [i for i in range(1000, 20000) if i not in tokenizer.special_token_ids]
    requests = random_requests(3, 7, vocab, (8, 40), OUTPUT_TOKENS)
    settings = ClientSettings(max_concurrency=2, progress=False)
    (result,) = llamacpp.run_rates(requests, [math.inf], settings, 2, tmp_path)

    assert result.server["parallel"] == 2 and result.server["threads"] == 2
    assert result.server["model"].endswith(".gguf")
    assert result.server["ctx_size"] >= 2 * max(r.prompt_len + r.max_tokens for r in requests)
    for request, timing in zip(requests, result.timings, strict=True):
        assert timing.ok, timing.error
        assert timing.output_tokens == request.max_tokens  # EOS ignored, as cbserve's
        assert timing.finish_reason == "LENGTH"
        assert 0 < timing.ttft <= timing.e2el <= result.wall_s
    summary = metrics.summarize(result.timings, result.wall_s)
    assert summary["completed"] == 3 and summary["output_throughput"] > 0
    assert summary["itl_ms"]["median"] > 0
    assert list(tmp_path.glob("llama-server-*.log"))  # its log is kept beside the results
