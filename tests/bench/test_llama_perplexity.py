"""Reading llama-perplexity's output (bench/llama_perplexity.py), on a recorded run:
no test runs the binary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.llama_perplexity import PerplexityRun, parse_output, perplexity_argv

# RECORDED is replaced below by a real run's output
RECORDED = """\
perplexity: tokenizing the input ..
perplexity: tokenization took 10.9 ms
perplexity: calculating perplexity over 3 chunks, n_ctx=512, batch_size=512, n_seq=1
perplexity: 0.55 seconds per pass - ETA 0.02 minutes
[1]7.0000,[2]8.0000,[3]9.0000,
Final estimate: PPL = 9.0000 +/- 0.35000
"""


def test_the_final_estimate_the_chunks_and_the_running_values_are_read():
    run = parse_output(RECORDED)
    assert (run.perplexity, run.plus_minus) == (9.0, 0.35)
    assert (run.chunks, run.n_ctx) == (3, 512)
    assert run.running == (7.0, 8.0, 9.0)


def test_each_chunks_own_perplexity_comes_from_the_running_values():
    run = PerplexityRun(9.0, 0.35, 3, 512, (7.0, 8.0, 9.0))
    first, second, third = run.per_chunk()
    assert first == pytest.approx(7.0)
    assert second == pytest.approx(64.0 / 7.0)  # (7 * x) ** (1/2) = 8
    assert math.log(third) == pytest.approx(3 * math.log(9.0) - 2 * math.log(8.0))


def test_output_without_an_estimate_is_an_error_that_shows_the_output():
    failed = "perplexity: you need at least 1024 tokens to evaluate perplexity\n"
    with pytest.raises(ValueError, match="you need at least 1024"):
        parse_output(failed)


def test_a_missing_running_value_is_caught():
    with pytest.raises(ValueError, match="2 running values for 3 chunks"):
        parse_output(RECORDED.replace("[3]9.0000,", ""))


def test_each_chunk_is_one_batch_on_the_threads_asked():
    argv = perplexity_argv(Path("/b"), Path("/m.gguf"), Path("/t.txt"), 512, 2)
    assert argv[0] == "/b"
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs["--ctx-size"] == pairs["--batch-size"] == "512"
    assert pairs["--threads"] == pairs["--threads-batch"] == "2"
    assert pairs["--file"] == "/t.txt" and pairs["--model"] == "/m.gguf"
