"""bench.scheduler.detokenize_cost run small, so that the script keeps working."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.process


def test_detokenize_cost_compares_both_decoders(model_dir, run_module):
    out = run_module("bench.scheduler.detokenize_cost", "--repeats", "1", "--eos-run", "50")
    for decoder in ("IncrementalDetokenizer", "DecodeStream"):
        assert re.search(rf"^CJK \+ emoji +\d+ tokens +{decoder} +[\d.]+ us/token", out, re.M)
    assert "IncrementalDetokenizer ' ok'" in out.splitlines()[-1]
