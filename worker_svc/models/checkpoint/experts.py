"""A mixture layer's weights in one layout, whichever way the checkpoint stores them.

Three layouts are found in the files people download:
- one tensor per expert and projection, `[out, in]` as nn.Linear keeps it
  (Qwen3-MoE's `mlp.experts.{e}.gate_proj.weight`, Mixtral's `experts.{e}.w1.weight`);
- llama.cpp's stacked 3-D tensors (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`),
  which read as `[experts, out, in]`;
- transformers' fused `gate_up_proj` of gpt-oss, `[experts, in, 2 * out]` with gate and
  up in alternating columns, and its bias `[experts, 2 * out]` alternating the same way.

Every compute path takes the same thing: per expert, one `[2 * I, hidden]` weight with
gate's rows then up's (as the dense MLP's fused gate/up), and one `[hidden, I]` down
weight, with their biases where the family has them. A shared expert (Qwen2-MoE) is
stored as a dense MLP, one 2-D tensor per projection in every format, and is fused the
same way, with the `[1, hidden]` weight of its sigmoid scale where the family has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from worker_svc.models.declaration import Architecture
from worker_svc.models.mixture import MoeSpec


@dataclass(frozen=True)
class ExpertWeights:
    router: torch.Tensor  # [experts, hidden]
    router_bias: torch.Tensor | None
    gate_up: tuple[torch.Tensor, ...]  # per expert, [2 * I, hidden]
    down: tuple[torch.Tensor, ...]  # per expert, [hidden, I]
    gate_up_bias: tuple[torch.Tensor, ...] | None
    down_bias: tuple[torch.Tensor, ...] | None
    # The shared expert (MoeSpec.shared_intermediate_size): [2 * S, hidden], [hidden, S]
    # and its gate's [1, hidden]; None where the family has none.
    shared_gate_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_gate_inp: torch.Tensor | None = None


def _has(state: Mapping[str, torch.Tensor], name: str) -> bool:
    # `in` on the lazy readers asks for the name only, never for the tensor.
    return name in state


def expert_weights(
    architecture: Architecture, state: Mapping[str, torch.Tensor], layer: int, moe: MoeSpec
) -> ExpertWeights:
    """Layer `layer`'s router and experts. Raises KeyError naming a missing tensor."""
    names = {role: name.replace("{i}", str(layer)) for role, name in architecture.hf_names.items()}

    def read(role: str) -> torch.Tensor:
        return state[names[role]]

    router_bias = read("router_bias") if moe.router_bias else None
    experts = range(moe.num_experts)
    if "experts_gate" in names and _has(state, names["experts_gate"]):
        gate, up, down = read("experts_gate"), read("experts_up"), read("experts_down")
        gate_up = tuple(torch.cat([gate[e], up[e]]) for e in experts)
        downs = tuple(down[e] for e in experts)
        gate_up_bias = down_bias = None
        if moe.expert_bias:
            gate_b, up_b = read("experts_gate_bias"), read("experts_up_bias")
            gate_up_bias = tuple(torch.cat([gate_b[e], up_b[e]]) for e in experts)
            down_bias = tuple(read("experts_down_bias")[e] for e in experts)
    elif "experts_gate_up_interleaved" in names:
        fused = read("experts_gate_up_interleaved")  # [E, hidden, 2I]
        gate_up = tuple(_deinterleave(fused[e].t()) for e in experts)
        down_t = read("experts_down_transposed")  # [E, I, hidden]
        downs = tuple(down_t[e].t().contiguous() for e in experts)
        gate_up_bias = down_bias = None
        if moe.expert_bias:
            fused_bias = read("experts_gate_up_interleaved_bias")
            gate_up_bias = tuple(_deinterleave(fused_bias[e]) for e in experts)
            down_bias = tuple(read("experts_down_bias")[e] for e in experts)
    else:

        def per_expert(role: str, e: int) -> torch.Tensor:
            return state[names[role].replace("{e}", str(e))]

        gate_up = tuple(
            torch.cat([per_expert("expert_gate", e), per_expert("expert_up", e)]) for e in experts
        )
        downs = tuple(per_expert("expert_down", e) for e in experts)
        gate_up_bias = down_bias = None
        if moe.expert_bias:
            raise NotImplementedError("biased experts stored one tensor per expert")
    shared = {}
    if moe.shared_intermediate_size is not None:
        shared["shared_gate_up"] = torch.cat([read("shared_gate"), read("shared_up")])
        shared["shared_down"] = read("shared_down")
        if moe.shared_expert_gated:
            shared["shared_gate_inp"] = read("shared_gate_inp")
    return ExpertWeights(
        read("router"), router_bias, gate_up, downs, gate_up_bias, down_bias, **shared
    )


def _deinterleave(rows: torch.Tensor) -> torch.Tensor:
    """Gate and up alternating along dim 0 -> gate's rows, then up's."""
    return torch.cat([rows[0::2], rows[1::2]]).contiguous()
