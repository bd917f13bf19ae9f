"""The accuracy bench's scoring on the real model (bench/accuracy/eval.py): scoring only
a chunk's second half, as llama-perplexity does, gives the same numbers as the tail of
scoring the whole chunk."""

from __future__ import annotations

import torch

from bench.accuracy.chunks import ChunkScoring
from bench.accuracy.eval import chunk_nlls, text_nll, token_nlls


def test_scoring_the_second_half_is_the_tail_of_scoring_it_all(loaded_model):
    ids = [(17 * i + 5) % 20000 + 100 for i in range(64)]
    whole = token_nlls(loaded_model, ids)
    tail = token_nlls(loaded_model, ids, score_from=32)
    assert whole.shape == (63,) and tail.shape == (31,)
    torch.testing.assert_close(tail, whole[32:], atol=1e-4, rtol=1e-4)
    total, count = text_nll(loaded_model, ids)
    assert count == 63 and abs(total - float(whole.sum())) < 1e-6


def test_chunk_nlls_scores_each_chunks_second_half(loaded_model):
    scoring = ChunkScoring(n_ctx=32)
    ids = [(31 * i + 7) % 20000 + 100 for i in range(70)]  # two chunks, 6 dropped
    chunks = scoring.chunks(ids)
    nlls = chunk_nlls(loaded_model, chunks, scoring.first_scored)
    assert len(nlls) == 2 * scoring.scored_per_chunk
    second = token_nlls(loaded_model, ids[32:64], score_from=16).tolist()
    assert nlls[scoring.scored_per_chunk :] == second
