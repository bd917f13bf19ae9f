"""A block model's mixture layers as the native step reads them (kernels/decode_experts.h):
per layer, its router's float32 weight and bias, each expert's gate/up and down blocks
with their biases, and the shared expert's blocks and gate row (Qwen2-MoE), as struct
moe_layer; the model-wide rule (k, the router, the activation, the shared expert's
width) goes in DecodeModel's fields (native.py)."""

from __future__ import annotations

import ctypes

import torch

from worker_svc.models.qblock.native_structs import BlockWeight, MoeLayer

ROUTERS = {"softmax_topk": 0, "topk_softmax": 1}  # decode_model.h's ROUTER_*
EXPERT_ACTIVATIONS = {"silu": 0, "swiglu_clamped": 2}  # decode_panels.h's ACTIVATION_*


class ExpertTables:
    """struct moe_layer for every layer (sparse 0 where the MLP is dense), and what their
    addresses point at: kept alive as long as the step may run."""

    def __init__(self, model):
        layers = model.layers
        self._kept: list = []
        self.layers = (MoeLayer * len(layers))()
        for index, layer in enumerate(layers):
            if layer.experts is not None:
                self.layers[index] = self._layer(layer.experts)

    def _keep(self, tensor: torch.Tensor) -> int:
        if tensor.dtype != torch.float32 or not tensor.is_contiguous():
            tensor = tensor.float().contiguous()
        self._kept.append(tensor)
        return tensor.data_ptr()

    def _weights(self, projections) -> ctypes.Array:
        weights = (BlockWeight * len(projections))(*(BlockWeight.of(p) for p in projections))
        self._kept.append(weights)
        return weights

    def _biases(self, projections) -> int:
        if all(p.bias is None for p in projections):
            return 0
        addresses = [0 if p.bias is None else self._keep(p.bias) for p in projections]
        return self._keep_int64(addresses)

    def _keep_int64(self, values: list[int]) -> int:
        table = torch.tensor(values, dtype=torch.int64)
        self._kept.append(table)
        return table.data_ptr()

    def _layer(self, experts) -> MoeLayer:
        router = experts.router
        gate_up, down = list(experts.gate_up_projs), list(experts.down_projs)
        shared: dict = {}
        if experts.shared_projs is not None:
            shared_gate_up, shared_down = self._weights(list(experts.shared_projs))
            shared = {
                "shared_gate_up": ctypes.pointer(shared_gate_up),
                "shared_down": ctypes.pointer(shared_down),
            }
            if experts.shared_gate_inp is not None:  # [1, hidden]: one float32 row
                shared["shared_gate"] = self._keep(experts.shared_gate_inp.weight.data)
        return MoeLayer(
            **shared,
            sparse=1,
            router=self._keep(router.weight.data),
            router_bias=0 if router.bias is None else self._keep(router.bias.data),
            gate_up=ctypes.cast(self._weights(gate_up), ctypes.POINTER(BlockWeight)),
            down=ctypes.cast(self._weights(down), ctypes.POINTER(BlockWeight)),
            gate_up_bias=self._biases(gate_up),
            down_bias=self._biases(down),
        )

    def fields(self, spec) -> dict:
        """DecodeModel's mixture fields for this spec (num_experts 0: no mixture)."""
        moe = spec.moe
        if moe is None:
            return {"moe_layers": ctypes.cast(self.layers, ctypes.POINTER(MoeLayer))}
        return {
            "moe_layers": ctypes.cast(self.layers, ctypes.POINTER(MoeLayer)),
            "num_experts": moe.num_experts,
            "experts_per_token": moe.experts_per_token,
            "expert_intermediate": moe.intermediate_size,
            "router": ROUTERS[moe.router],
            "normalize_topk": int(moe.normalize_topk),
            "expert_activation": EXPERT_ACTIVATIONS[moe.activation],
            "swiglu_alpha": moe.swiglu_alpha,
            "swiglu_limit": moe.swiglu_limit,
            "shared_intermediate": moe.shared_intermediate_size or 0,
        }
