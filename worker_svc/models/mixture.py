"""A layer's MLP as a mixture of experts, declared: how many experts, how a token picks
its k, and what each expert computes. Part of a checkpoint's DecoderSpec (`spec.moe`),
read by every compute path as the dense fields are.

The families differ only in these fields (transformers' modules, 5.x):
- Qwen3-MoE: softmax over all experts in float32, top-k, the k weights renormalized
  where `norm_topk_prob`, cast back to the activations' dtype; SwiGLU experts;
  layers listed in `mlp_only_layers` (or off the `decoder_sparse_step`) stay dense.
- Mixtral: the same router, always renormalized, weights kept in float32.
- gpt-oss: a biased router whose top-k *logits* are softmaxed; experts with biases
  and a clamped SwiGLU (`gate * sigmoid(alpha * gate) * (up + 1)`, gate clamped from
  above and up on both sides at `limit`).
- Qwen2-MoE: Qwen3-MoE's router, plus a shared expert: a dense SwiGLU MLP of
  `shared_expert_intermediate_size` that every token runs, scaled per token by
  `sigmoid(shared_expert_gate(x))` (a `[1, hidden]` weight) and added to the routed
  experts' sum.
"""

from __future__ import annotations

from dataclasses import dataclass

ROUTERS = ("softmax_topk", "topk_softmax")
EXPERT_ACTIVATIONS = ("silu", "swiglu_clamped")


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    experts_per_token: int
    intermediate_size: int  # of one expert
    # Which layers' MLP is the mixture; the others are the dense MLP of the spec.
    sparse_layers: frozenset[int]
    # "softmax_topk": softmax over every expert, then the k largest probabilities;
    # "topk_softmax": the k largest logits, then a softmax over those k.
    router: str = "softmax_topk"
    # softmax_topk only: divide the k chosen probabilities by their sum.
    normalize_topk: bool = True
    # Whether the k weights are cast back to the activations' dtype before they scale
    # the experts' outputs (Qwen3-MoE) or stay float32 (Mixtral). Equal in float32.
    weights_in_activation_dtype: bool = True
    router_bias: bool = False
    expert_bias: bool = False
    activation: str = "silu"
    swiglu_alpha: float = 1.702  # swiglu_clamped only
    swiglu_limit: float = 7.0
    # A dense SwiGLU expert every token runs beside its k (Qwen2-MoE, DeepSeek): its
    # intermediate width, None where the family has none.
    shared_intermediate_size: int | None = None
    # Whether the shared expert's output is scaled per token by sigmoid(w . x), w the
    # `[1, hidden]` weight of the "shared_gate_inp" role (Qwen2-MoE), or added as is.
    shared_expert_gated: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"{self.experts_per_token} experts per token of {self.num_experts} experts"
            )
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {self.router!r}")
        if self.activation not in EXPERT_ACTIVATIONS:
            raise ValueError(
                f"expert activation must be one of {EXPERT_ACTIVATIONS}, got {self.activation!r}"
            )
        if any(not isinstance(i, int) or i < 0 for i in self.sparse_layers):
            raise ValueError(f"sparse layers must be layer indices, got {self.sparse_layers}")
        if self.swiglu_limit <= 0:
            raise ValueError(f"swiglu_limit must be positive, got {self.swiglu_limit}")
        shared = self.shared_intermediate_size
        if shared is not None and (isinstance(shared, bool) or not isinstance(shared, int)):
            raise ValueError(f"shared_intermediate_size must be an integer, got {shared!r}")
        if shared is not None and shared <= 0:
            raise ValueError(f"shared_intermediate_size must be positive, got {shared}")
        if self.shared_expert_gated and shared is None:
            raise ValueError("a gated shared expert needs shared_intermediate_size")

    def features(self) -> dict[str, bool]:
        """The mixture's features a compute path may lack (see DecoderSpec.features)."""
        return {
            "mixture-of-experts layers": True,
            "a biased router": self.router_bias,
            "biased experts": self.expert_bias,
            "clamped SwiGLU experts": self.activation == "swiglu_clamped",
            "a shared expert": self.shared_intermediate_size is not None,
        }


def sparse_layers(num_layers: int, sparse_step: int = 1, dense_layers=()) -> frozenset[int]:
    """transformers' Qwen-MoE rule: layer i is sparse when (i + 1) is a multiple of
    `decoder_sparse_step` and i is not in `mlp_only_layers`."""
    if sparse_step <= 0:
        raise ValueError(f"decoder_sparse_step must be positive, got {sparse_step}")
    dense = set(dense_layers or ())
    return frozenset(i for i in range(num_layers) if (i + 1) % sparse_step == 0 and i not in dense)
