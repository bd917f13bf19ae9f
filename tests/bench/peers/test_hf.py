"""transformers' batched generate as a baseline: every requested token timed, batch by batch."""

from __future__ import annotations

import pytest

from bench.harness.workload import random_requests

pytestmark = pytest.mark.model


def test_every_requested_token_is_timed_and_batches_run_one_after_another(model_dir, tokenizer):
    pytest.importorskip("transformers")
    from bench.peers import hf

    vocab = [i for i in range(1000, 5000) if i not in tokenizer.special_token_ids]
    requests = random_requests(3, 0, vocab, (4, 12), (2, 5))
    timings, wall, info = hf.run(model_dir, "float32", requests, 2, progress=False)

    assert info["batch_size"] == 2 and wall > 0
    assert [t.output_tokens for t in timings] == [r.max_tokens for r in requests]
    assert [t.prompt_tokens for t in timings] == [r.prompt_len for r in requests]
    # All arrived at the start of the run; one batch shares its steps.
    assert len({t.sent_at for t in timings}) == 1
    assert timings[0].chunks[0][0] == timings[1].chunks[0][0]
    # The second batch starts only when the first has run its longest request out.
    assert timings[2].chunks[0][0] > max(t.chunks[-1][0] for t in timings[:2])
