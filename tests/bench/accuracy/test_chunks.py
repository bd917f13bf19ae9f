"""llama-perplexity's scoring rules (bench/accuracy/chunks.py), torch-free."""

from __future__ import annotations

import math

import pytest

from bench.accuracy.chunks import ChunkScoring, Estimate, chunked_table, compare_ids, per_chunk


def test_chunks_are_whole_n_ctx_runs_and_the_remainder_is_dropped():
    ids = list(range(10, 10 + 2 * 8 + 5))
    chunks = ChunkScoring(n_ctx=8).chunks(ids)
    assert chunks == [ids[0:8], ids[8:16]]


def test_the_second_half_is_scored_each_scored_token_with_n_ctx_over_2_before_it():
    scoring = ChunkScoring(n_ctx=512)
    assert scoring.first_scored == 256
    # logits at 256..510 predict tokens 257..511: 255 a chunk, as llama-perplexity counts
    assert scoring.scored_per_chunk == 255
    assert ChunkScoring(n_ctx=7).scored_per_chunk == 7 - 3 - 1


def test_bos_replaces_every_chunks_first_token_where_the_vocabulary_adds_one():
    ids = [1, 5, 6, 7, 8, 9, 10, 11]
    assert ChunkScoring(n_ctx=4, bos_id=1).chunks(ids) == [[1, 5, 6, 7], [1, 9, 10, 11]]
    assert ChunkScoring(n_ctx=4).chunks(ids)[1][0] == 8


def test_fewer_than_two_chunks_of_tokens_are_refused_as_llama_perplexity_does():
    with pytest.raises(ValueError, match="at least 16"):
        ChunkScoring(n_ctx=8).chunks(list(range(15)))
    with pytest.raises(ValueError):
        ChunkScoring(n_ctx=2)


def test_estimate_is_exp_mean_nll_with_the_standard_error_times_perplexity():
    nlls = [1.0, 2.0, 3.0, 2.0]
    estimate = Estimate.from_nlls(nlls)
    assert estimate.perplexity == pytest.approx(math.exp(2.0))
    # population variance 0.5 over n - 1 = 3, as llama-perplexity's nll2 formula
    assert estimate.plus_minus == pytest.approx(math.sqrt(0.5 / 3) * math.exp(2.0))
    assert estimate.tokens == 4


def test_identical_ids_say_so_and_differing_ones_say_where():
    assert "identical" in compare_ids([1, 2, 3], [1, 2, 3])
    # one token split in two (as ours splits "\n\n" before a digit, llama.cpp does not),
    # twice: two places, not every later position
    ours, theirs = [7, 1, 1, 5, 6, 1, 1, 8], [7, 11, 5, 6, 11, 8]
    said = compare_ids(ours, theirs)
    assert "ours, 8, differ in 2 places: 4 of our tokens for 2 of theirs, the first at 1" in said


def test_per_chunk_perplexities_split_the_nlls_evenly():
    values = per_chunk([1.0, 3.0, 0.0, 0.0], 2)
    assert values == pytest.approx([math.exp(2.0), 1.0])


def _report(llamacpp: dict) -> dict:
    def row(ppl):
        return {"chunked": {"perplexity": ppl, "plus_minus": 0.25}}

    return {
        "paths": {"float32": row(8.0), "q4_1": row(8.08)},
        "chunked": {"n_ctx": 512, "chunks": 3, "token_ids": "ours", "llama.cpp": llamacpp},
    }


def test_the_table_has_llama_cpp_beside_our_paths_against_float32():
    text = chunked_table(_report({"perplexity": 8.4, "plus_minus": 0.3}))
    assert "3 chunks of 512 tokens" in text and "(765 tokens)" in text
    assert "| q4_1 (cbserve) | 8.0800 | 0.2500 | 1.0100x |" in text
    assert "| Q4_1 GGUF (llama.cpp llama-perplexity) | 8.4000 | 0.3000 | 1.0500x |" in text


def test_the_table_says_why_llama_cpp_is_left_out():
    text = chunked_table(_report({"skipped": "llama-perplexity is not built"}))
    assert "llama.cpp llama-perplexity" not in text.split("left out")[0]
    assert text.endswith("llama.cpp left out: llama-perplexity is not built")


def _replies_report(llamacpp: dict) -> dict:
    row = {
        "perplexity": 9.3,
        "ratio": 1.0,
        "replies": [[1, 2], [3, 4]],
        "equal_replies": 2,
        "passes": True,
        "first_reply": "Paris.",
    }
    return {"texts": 2, "tokens": 10, "paths": {"float32": row}, "llama.cpp replies": llamacpp}


def test_the_replies_table_has_llama_servers_greedy_replies_when_built():
    from bench.accuracy.gate import table

    theirs = {"replies": [[1, 2], [3, 5]], "equal_replies": 1, "first_reply": "L'Etoile"}
    lines = table(_replies_report(theirs), 2).splitlines()
    assert lines[-1].startswith("| llama.cpp Q4_1 (llama-server, greedy) |")
    assert "| 1/2 |" in lines[-1] and lines[-1].endswith("| L'Etoile |")
    skipped = table(_replies_report({"skipped": "not built"}), 2)
    assert "llama.cpp" not in skipped
