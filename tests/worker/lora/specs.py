"""DecoderSpecs of the default model's shape (SmolLM2-135M) without its weights, for the
tests that need only the shapes an adapter must fit."""

from __future__ import annotations

from worker_svc.models.declaration import DecoderSpec, LayerAttention, RopeSpec
from worker_svc.models.mixture import MoeSpec

NUM_LAYERS = 30
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64


def smollm_spec(num_layers: int = NUM_LAYERS, sparse_layers: frozenset[int] = frozenset()):
    """The default model's decoder; `sparse_layers` makes those a mixture of experts."""
    moe = None
    if sparse_layers:
        moe = MoeSpec(num_experts=4, experts_per_token=2, intermediate_size=64,
                      sparse_layers=sparse_layers)  # fmt: skip
    return DecoderSpec(
        architecture="llama",
        hidden_size=HIDDEN,
        intermediate_size=INTER,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        vocab_size=49152,
        max_positions=8192,
        rms_norm_eps=1e-5,
        layers=(LayerAttention(RopeSpec(100000.0)),) * num_layers,
        tied_head=True,
        moe=moe,
    )
