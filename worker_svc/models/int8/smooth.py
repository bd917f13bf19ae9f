"""Turns a float32 own forward (Llama layout only) into the int8 path (SmoothQuant folding, then
fbgemm int8 projections).

Per-token int8 activations lose the small channels of a token that also carries a
large one, and these models have such outlier channels at every projection input
(on SmolLM2, a token's largest input is 50-200x its median). SmoothQuant moves that
range into the weights: input channel c is divided by s_c and the weights' column c
multiplied by it, with s_c = sqrt(max|x_c| / max|W[:, c]|) from one calibration
forward. Every division folds into the tensor that produces the input, so it costs
nothing per step:
- QKV and gate/up: into the RMSNorm weight before them;
- down: into the rows of the up projection (silu(gate) * up is linear in up);
- output projection: into the rows of V (attention output is a weighted sum of V),
  one scale per KV head channel, shared by the query heads of its group;
- LM head: into the final RMSNorm weight.
"""

from __future__ import annotations

import torch

from worker_svc.attention.torch_backend import scratch_context
from worker_svc.compute.linear import DenseLinear, Int8Linear
from worker_svc.models.forward.decoder import DecoderForCausalLM

# SmoothQuant's migration strength: 0.5 splits the range evenly between the two.
ALPHA = 0.5
CALIBRATION_TOKENS = 256


def quantize_to_int8(model: DecoderForCausalLM) -> None:
    """In place: smooth every projection input, then make every projection int8."""
    input_max = _calibrate(model)
    for index, layer in enumerate(model.layers):
        _smooth_into_norm(layer.attn_norm.weight, layer.qkv_proj, input_max[(index, "qkv")])
        _smooth_into_norm(layer.mlp_norm.weight, layer.gate_up_proj, input_max[(index, "gate_up")])
        _smooth_down(layer, input_max[(index, "down")])
        _smooth_output(layer, input_max[(index, "o")])
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            setattr(layer, name, Int8Linear(getattr(layer, name).weight.data))
    # A tied LM head shares its tensor with the embedding, which must stay unscaled.
    model.lm_head = DenseLinear(model.lm_head.weight.data.clone(), torch.float32)
    _smooth_into_norm(model.norm.weight, model.lm_head, input_max["lm_head"])
    model.lm_head = Int8Linear(model.lm_head.weight.data)
    # The tensors left in float32 (embedding, norms) may still be views of the
    # checkpoint's memory map, which would keep all of its float32 pages resident.
    for tensor in (*model.parameters(), *model.buffers()):
        tensor.data = tensor.data.clone()


def _scales(activation_max: torch.Tensor, weight_max: torch.Tensor) -> torch.Tensor:
    """SmoothQuant's s = max|x|^alpha / max|W|^(1 - alpha), per input channel."""
    return (
        activation_max.clamp(min=1e-5) ** ALPHA / weight_max.clamp(min=1e-5) ** (1 - ALPHA)
    ).clamp(min=1e-5)


def _column_max(weight: torch.Tensor) -> torch.Tensor:
    return weight.abs().amax(dim=0)


def _smooth_into_norm(norm_weight, projection: DenseLinear, activation_max) -> None:
    s = _scales(activation_max, _column_max(projection.weight.data))
    norm_weight.data.div_(s)
    projection.weight.data.mul_(s)


def _smooth_down(layer, activation_max) -> None:
    s = _scales(activation_max, _column_max(layer.down_proj.weight.data))
    inter = s.numel()
    # gate_up's rows are [gate; up]: only up's rows carry the division.
    layer.gate_up_proj.weight.data[inter:].div_(s[:, None])
    layer.down_proj.weight.data.mul_(s)


def _smooth_output(layer, activation_max) -> None:
    heads, kv_heads, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    group = heads // kv_heads
    per_kv = activation_max.view(kv_heads, group, d).amax(dim=1)  # [KV, d]
    weight_max = _column_max(layer.o_proj.weight.data).view(kv_heads, group, d).amax(dim=1)
    s = _scales(per_kv, weight_max)
    v_start = (heads + kv_heads) * d
    layer.qkv_proj.weight.data[v_start:].div_(s.reshape(-1, 1))
    layer.o_proj.weight.data.mul_(s[:, None, :].expand(kv_heads, group, d).reshape(1, -1))


@torch.inference_mode()
def _calibrate(model: DecoderForCausalLM) -> dict:
    """Per input channel, the largest |activation| each projection sees on one prompt."""
    seen: dict = {}
    hooks = []

    def record(key):
        def hook(module, args):
            value = args[0].abs().amax(dim=0).float()
            seen[key] = torch.maximum(seen[key], value) if key in seen else value

        return hook

    for index, layer in enumerate(model.layers):
        for key, module in (
            ("qkv", layer.qkv_proj),
            ("o", layer.o_proj),
            ("gate_up", layer.gate_up_proj),
            ("down", layer.down_proj),
        ):
            hooks.append(module.register_forward_pre_hook(record((index, key))))
    hooks.append(model.lm_head.register_forward_pre_hook(record("lm_head")))
    try:
        ids = _calibration_ids(model.spec.vocab_size)
        t = len(ids)
        shape = model.spec
        context = scratch_context(
            shape.num_layers, shape.num_kv_heads, shape.head_dim, torch.float32, (t,)
        )
        model(ids, torch.arange(t), context, torch.arange(t))
    finally:
        for handle in hooks:
            handle.remove()
    return seen


def _calibration_ids(vocab_size: int) -> torch.Tensor:
    """Token ids spread over the vocabulary, fixed: the outlier channels of these models
    are properties of the weights (the same channels for any text), so any tokens find
    them; a fixed sequence makes the int8 weights the same at every start."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (CALIBRATION_TOKENS,), generator=generator)
