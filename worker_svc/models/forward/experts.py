"""A mixture-of-experts MLP over the flat batch `[T, hidden]`, for every compute path.

Each expert is two projections of the path (make_projection, or the block path's
QBlockLinear put in their place by qblock/build.py): its fused gate/up and its down.
A step reads only the experts its tokens chose:
- rows are grouped by expert, as vLLM's fused MoE and llama.cpp's `mul_mat_id` group
  them: each chosen expert runs once on all of its rows (one projection call with M =
  its rows), so with many rows every expert's weights are read once a step;
- at one row (a lone stream decoding), that is its k experts, and nothing else of
  the layer's expert weights is touched.
The outputs are summed per token in ascending expert order, the order transformers'
modules add them in, so that float32 stays equal to the reference. A shared expert
(Qwen2-MoE) runs on every row as a dense MLP, is scaled by its sigmoid gate and added
to that sum last, as transformers adds it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker_svc.compute.projections import make_projection
from worker_svc.models.checkpoint.experts import ExpertWeights
from worker_svc.models.forward.layers import silu_and_mul
from worker_svc.models.mixture import MoeSpec


def route(logits: torch.Tensor, moe: MoeSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits `[T, experts]` -> (weights `[T, k]`, expert ids `[T, k]`), each
    family's rule (models/mixture.py) in transformers' order of operations."""
    k = moe.experts_per_token
    if moe.router == "topk_softmax":
        top, chosen = torch.topk(logits, k, dim=-1)
        return F.softmax(top, dim=-1, dtype=top.dtype), chosen
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    top, chosen = torch.topk(probs, k, dim=-1)
    if moe.normalize_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    if moe.weights_in_activation_dtype:
        top = top.to(logits.dtype)
    return top, chosen


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's expert activation on `[rows, 2 * I]` (gate's columns, then up's)."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


class ExpertMlp(nn.Module):
    """Router, top-k and the chosen experts of one layer; `[T, hidden]` -> `[T, hidden]`."""

    def __init__(self, moe: MoeSpec, weights: ExpertWeights, path: str):
        super().__init__()
        self.moe = moe
        # The router stays dense on every path: a few KB, and its choice must not
        # move with a weight format's rounding.
        router_path = path if path in ("float32", "bfloat16", "float16") else "float32"
        self.router = make_projection(weights.router, router_path, weights.router_bias)
        gate_up_bias = weights.gate_up_bias or (None,) * moe.num_experts
        down_bias = weights.down_bias or (None,) * moe.num_experts
        self.gate_up_projs = nn.ModuleList(
            make_projection(w, path, b) for w, b in zip(weights.gate_up, gate_up_bias, strict=True)
        )
        self.down_projs = nn.ModuleList(
            make_projection(w, path, b) for w, b in zip(weights.down, down_bias, strict=True)
        )
        # The shared expert's fused gate/up and down, and its gate (dense, as the router).
        self.shared_projs = None
        self.shared_gate_inp = None
        if weights.shared_gate_up is not None:
            self.shared_projs = nn.ModuleList(
                make_projection(w, path) for w in (weights.shared_gate_up, weights.shared_down)
            )
        if weights.shared_gate_inp is not None:
            self.shared_gate_inp = make_projection(weights.shared_gate_inp, router_path)
        # Tokens routed to each expert since load (worker_svc/router_stats.py): Python
        # integers, which the routing below has at hand anyway.
        self.tokens_per_expert = [0] * moe.num_experts

    def projections(self) -> list:
        """Every expert's gate/up projection, then every down one, then the shared
        expert's: the order the block path lays their weights out in and the native
        step reads them."""
        return [*self.gate_up_projs, *self.down_projs, *(self.shared_projs or ())]

    def activation(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.moe.activation == "swiglu_clamped":
            return clamped_swiglu(gate_up, self.moe.swiglu_alpha, self.moe.swiglu_limit)
        return silu_and_mul(gate_up)

    def expert(self, index: int, rows: torch.Tensor) -> torch.Tensor:
        return self.down_projs[index](self.activation(self.gate_up_projs[index](rows)))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.routed(hidden)
        if self.shared_projs is None:
            return out
        gate_up, down = self.shared_projs
        shared = down(silu_and_mul(gate_up(hidden)))
        if self.shared_gate_inp is not None:
            shared = torch.sigmoid(self.shared_gate_inp(hidden)) * shared
        return out + shared

    def routed(self, hidden: torch.Tensor) -> torch.Tensor:
        """The k chosen experts' weighted sum per row."""
        weights, chosen = route(self.router(hidden), self.moe)
        counted = self.tokens_per_expert
        out = torch.zeros_like(hidden)
        if hidden.shape[0] == 1:
            # One row: its k experts, in ascending order.
            order = torch.argsort(chosen[0])
            for slot, expert in zip(order.tolist(), chosen[0, order].tolist(), strict=True):
                counted[expert] += 1
                y = self.expert(expert, hidden) * weights[:, slot, None]
                out += y.to(out.dtype)
            return out
        k = self.moe.experts_per_token
        flat = chosen.flatten()
        # Stable: within an expert, its rows stay in token order.
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.moe.num_experts).tolist()
        tokens, slots = order // k, order % k
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            counted[expert] += count
            rows, slot = tokens[start : start + count], slots[start : start + count]
            start += count
            y = self.expert(expert, hidden[rows]) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(out.dtype))
        return out
