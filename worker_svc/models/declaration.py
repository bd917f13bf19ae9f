"""What an architecture is, declared once: everything in which Llama 3, Mistral, Qwen2,
Qwen3 and Gemma 3 differ, read by every compute path (the float forward, the block path,
the native decode step) and by the weight readers.

Two levels, because a family's rules and one checkpoint's numbers change at different
times:
- `Architecture`: the family's fixed rules (its weight names in safetensors and in GGUF,
  how llama.cpp's converter wrote its rope pairs and norms, which config keys it reads
  with which defaults). One instance per module in `models/architectures/`.
- `DecoderSpec`: one checkpoint's shape and features, resolved from its config by its
  architecture (`Architecture.spec`), validated at construction. A compute path checks
  it with `unsupported(...)` at load and refuses what it cannot compute, naming why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker_svc.models.mixture import MoeSpec

# The weights of one decoder layer, by role. An architecture maps the roles it has to
# its names in a Hugging Face checkpoint ("{i}" is the layer index) and in a GGUF file.
LAYER_ROLES = (
    "attn_norm",  # before attention
    "q",
    "k",
    "v",
    "o",
    "o_bias",  # gpt-oss
    "sinks",  # one learned logit per query head, in every softmax (gpt-oss)
    "q_bias",
    "k_bias",
    "v_bias",
    "q_norm",  # per head, before rotary (Qwen3, Gemma 3)
    "k_norm",
    "attn_post_norm",  # on attention's output, before the residual (Gemma 3)
    "mlp_norm",  # before the MLP (Llama's "post_attention_layernorm")
    "gate",
    "up",
    "down",
    "mlp_post_norm",  # on the MLP's output, before the residual (Gemma 3)
)
# A mixture layer's weights (models/mixture.py), by where a family stores them:
# "{e}" is the expert. Read into one layout by checkpoint/experts.py.
EXPERT_ROLES = (
    "router",  # [experts, hidden]
    "router_bias",
    "expert_gate",  # one tensor per expert, [intermediate, hidden] (Qwen3-MoE, Mixtral)
    "expert_up",
    "expert_down",
    "experts_gate",  # stacked 3-D [experts, intermediate, hidden] (GGUF's *_exps)
    "experts_up",
    "experts_down",
    "experts_gate_bias",
    "experts_up_bias",
    "experts_down_bias",
    # transformers' fused [experts, hidden, 2 * intermediate] with gate and up columns
    # interleaved (gpt-oss), and its bias [experts, 2 * intermediate]
    "experts_gate_up_interleaved",
    "experts_gate_up_interleaved_bias",
    "experts_down_transposed",  # its down, [experts, intermediate, hidden]
    # The shared expert (MoeSpec.shared_intermediate_size), a dense SwiGLU MLP every token
    # runs, named as llama.cpp names it (`ffn_*_shexp`), and the `[1, hidden]` weight
    # whose sigmoid scales its output per token (Qwen2-MoE's `shared_expert_gate`).
    "shared_gate",
    "shared_up",
    "shared_down",
    "shared_gate_inp",
)
MODEL_ROLES = ("embed", "final_norm", "lm_head")


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: its base and, where the config asks, its frequency scaling."""

    theta: float
    # "default", "linear" (positions divided by `factor`), "llama3" (Llama 3.1's
    # smoothed per-frequency scaling), "factors" (each frequency divided by its own
    # factor, as a GGUF's rope_freqs tensor gives Llama 3's scaling) or "yarn" (YaRN:
    # gpt-oss, Qwen's long contexts; frequencies blended between `factor`-slowed and
    # kept by a ramp from beta_fast to beta_slow rotations over original_max_positions,
    # and cos/sin scaled by the attention factor).
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192
    factors: tuple[float, ...] = ()
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # YaRN's ramp bounds rounded to whole dimensions
    # YaRN's cos/sin scale; None: 0.1 * ln(factor) + 1, as the paper (and transformers)
    # suggest. A config's mscale/mscale_all_dim are resolved into it when it is read.
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("default", "linear", "llama3", "factors", "yarn"):
            raise ValueError(f"rope type {self.kind!r} is not computed by the own forward")
        if self.theta <= 0 or self.factor <= 0:
            raise ValueError(f"rope theta and factor must be positive: {self}")
        if self.attention_factor is not None and self.attention_factor <= 0:
            raise ValueError(f"rope attention_factor must be positive: {self}")


@dataclass(frozen=True)
class LayerAttention:
    """How one layer attends: its rotary table and, for a sliding layer, its window
    (a token sees itself and the window - 1 tokens before it, as transformers masks)."""

    rope: RopeSpec
    window: int | None = None


@dataclass(frozen=True)
class DecoderSpec:
    """One checkpoint's decoder, as every compute path reads it."""

    architecture: str  # the declaring module's name: "llama", "qwen3", ...
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    rms_norm_eps: float
    layers: tuple[LayerAttention, ...]
    tied_head: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    # Gemma's norms multiply by (1 + w) in float32 and round after; Llama's round the
    # normalized activations first and multiply by w. Equal in float32.
    norm_one_plus: bool = False
    sandwich_norms: bool = False  # attn_post_norm and mlp_post_norm
    activation: str = "silu"  # "silu" or "gelu_tanh", on gate; times up
    embed_scale: float | None = None  # Gemma: sqrt(hidden_size)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    o_bias: bool = False
    # A learned logit per query head that joins each softmax's sum (gpt-oss): attention
    # may put weight on no key. The backend must compute them (supports_sinks).
    attention_sinks: bool = False
    # The mixture of experts of the layers it names; None: every layer is dense.
    moe: MoeSpec | None = None

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
            "max_positions",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.rms_norm_eps, float) or self.rms_norm_eps <= 0:
            raise ValueError(f"rms_norm_eps must be a positive number, got {self.rms_norm_eps!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary, got {self.head_dim}")
        if not self.layers:
            raise ValueError("a decoder needs at least one layer")
        if self.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"activation {self.activation!r} is not computed by the own forward")
        for layer in self.layers:
            if layer.window is not None and layer.window <= 0:
                raise ValueError(f"a sliding window must be positive, got {layer.window}")
        if self.moe is not None and max(self.moe.sparse_layers, default=-1) >= len(self.layers):
            raise ValueError(f"sparse layers {sorted(self.moe.sparse_layers)} past the last layer")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def scale(self) -> float:
        return self.attention_scale if self.attention_scale is not None else self.head_dim**-0.5

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(layer.window for layer in self.layers)

    def features(self) -> dict[str, bool]:
        """The features a compute path may lack, by the name its refusal gives."""
        return {
            "q/k/v biases": self.qkv_bias,
            "per-head q/k norms": self.qk_norm,
            "(1 + w) norms": self.norm_one_plus,
            "post-attention and post-MLP norms": self.sandwich_norms,
            "GELU-tanh": self.activation == "gelu_tanh",
            "a scaled embedding": self.embed_scale is not None,
            "sliding-window layers": any(w is not None for w in self.windows),
            "rope scaling": any(layer.rope.kind != "default" for layer in self.layers),
            "two rope bases": len({layer.rope for layer in self.layers}) > 1,
            "logit soft-capping": self.final_logit_softcap is not None,
            "attention soft-capping": self.attn_logit_softcap is not None,
            "an o_proj bias": self.o_bias,
            "attention sinks": self.attention_sinks,
            **(self.moe.features() if self.moe is not None else {}),
        }

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is the mixture of experts."""
        return self.moe is not None and layer in self.moe.sparse_layers

    def unsupported(self, supported: frozenset[str]) -> list[str]:
        """The features this checkpoint has that a path's `supported` set lacks."""
        return [name for name, used in self.features().items() if used and name not in supported]


@dataclass(frozen=True)
class Architecture:
    """A model family's fixed rules. `spec` reads a config (the light reader's
    ConfigFile or transformers' own: both answer getattr) into a DecoderSpec, and
    raises NotImplementedError for a setting the own forward does not compute."""

    name: str
    hf_architectures: tuple[str, ...]
    # `general.architecture` in a GGUF file.
    gguf_architecture: str
    # config.json `model_type`s the light reader accepts, with transformers' defaults
    # for the keys such a file may leave out, and keys it may carry that change nothing.
    model_types: tuple[str, ...]
    config_defaults: Mapping[str, Any]
    spec: Callable[[Any], DecoderSpec]
    # role -> name, "{i}" for the layer; a role the family lacks is absent.
    hf_names: Mapping[str, str]
    gguf_names: Mapping[str, str]
    # llama.cpp's converter reorders q/k rows into interleaved pairs (its NORM rope)
    # for llama only; qwen2/qwen3/gemma keep rotate-half (NEOX): nothing to undo.
    gguf_permutes_qk: bool = False
    # llama.cpp's converter writes Gemma's norm weights with the 1 already added.
    gguf_norms_plus_one: bool = False
    # Fills in, from a GGUF's metadata (`get("rope.freq_base_swa")`), the config keys
    # that llama.cpp stores under its own names or fixes per architecture.
    gguf_config: Callable[[dict[str, Any], Callable[..., Any]], None] | None = None
    ignored_config_keys: frozenset[str] = field(default_factory=frozenset)
