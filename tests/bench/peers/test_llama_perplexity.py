"""Reading llama-perplexity's output (bench/peers/llama_perplexity.py), on a recorded run:
no test runs the binary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.peers.llama_perplexity import PerplexityRun, parse_output, perplexity_argv

# The lines that matter from a real run (llama.cpp of llama-cpp-python 0.3.36, the
# shipped SmolLM2 Q4_1 GGUF, the accuracy bench's held-out document, -c 512 -t 2), in
# the order its stdout and stderr came out together; the model loader's lines dropped.
RECORDED = """\
0.00.547.858 I perplexity: tokenizing the input ..
0.00.568.836 I perplexity: tokenization took 20.969 ms
0.00.568.882 I perplexity: calculating perplexity over 18 chunks, n_ctx=512, batch_size=512, n_seq=1
0.08.106.359 I perplexity: 7.54 seconds per pass - ETA 2.25 minutes
[1]46.0648,[2]25.3823,[3]19.0646,[4]11.9054,[5]9.3443,[6]8.9560,[7]7.4561,[8]7.6081,[9]7.3794,[10]7.4730,[11]7.2109,[12]6.6468,[13]7.3605,[14]7.9959,[15]7.4985,[16]7.2887,[17]7.2760,[18]7.2960,
2.44.204.183 I Final estimate: PPL = 7.2960 +/- 0.28816
"""


def test_the_final_estimate_the_chunks_and_the_running_values_are_read():
    run = parse_output(RECORDED)
    assert (run.perplexity, run.plus_minus) == (7.2960, 0.28816)
    assert (run.chunks, run.n_ctx) == (18, 512)
    assert run.running[:3] == (46.0648, 25.3823, 19.0646) and run.running[-1] == 7.2960


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
    with pytest.raises(ValueError, match="17 running values for 18 chunks"):
        parse_output(RECORDED.replace("[3]19.0646,", ""))


def test_each_chunk_is_one_batch_on_the_threads_asked():
    argv = perplexity_argv(Path("/b"), Path("/m.gguf"), Path("/t.txt"), 512, 2)
    assert argv[0] == "/b"
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs["--ctx-size"] == pairs["--batch-size"] == "512"
    assert pairs["--threads"] == pairs["--threads-batch"] == "2"
    assert pairs["--file"] == "/t.txt" and pairs["--model"] == "/m.gguf"
