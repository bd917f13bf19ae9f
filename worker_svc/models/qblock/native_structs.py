"""The native decode step's C structures (kernels/decode_model.h) as ctypes: what
native.py fills once per model (DecodeModel, a BlockWeight per projection) and once per
step (DecodeBatch). Field for field as the header declares them; a field added there is
added here in the same place."""

from __future__ import annotations

import ctypes

import torch

from worker_svc.compute.qblock_stack import block_runs

_I64, _F64, _PTR = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p
# The pool element types the step writes and attends over (decode_step.c's KV_FLOAT*):
# float32, the reference, and float16 (--kv-cache-dtype float16).
KV_DTYPES = {torch.float32: 0, torch.float16: 1}


WEIGHT_RUNS = 3  # decode_model.h: a fused QKV's three parts, each its own format at most
# A layer's projections in decode_model.h's order (PROJ_QKV .. PROJ_DOWN), which is also
# the order the step reads them in (compute/block_arena.py lays weights out by it).
STEP_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class BlockWeight(ctypes.Structure):
    """struct block_weight: a projection's runs of rows, each in its own format."""

    _fields_ = [
        ("runs", _I64),
        ("run_end", _I64 * WEIGHT_RUNS),
        ("format", _I64 * WEIGHT_RUNS),
        ("blocks", _PTR * WEIGHT_RUNS),
        ("act8", _I64),  # QBlockLinear.act8: 8-bit activation blocks where VNNI runs
    ]

    @classmethod
    def of(cls, projection) -> BlockWeight:
        runs = block_runs(projection)
        if len(runs) > WEIGHT_RUNS:
            raise ValueError(f"{len(runs)} runs of formats in one projection (at most 3)")
        weight = cls(runs=len(runs), act8=int(len(runs) == 1 and runs[0].act8))
        end = 0
        for i, run in enumerate(runs):
            end += run.out_features
            weight.run_end[i], weight.format[i] = end, run.format.code
            weight.blocks[i] = run.blocks.data_ptr()
        return weight


class MoeLayer(ctypes.Structure):
    """struct moe_layer: a mixture layer's router and experts (sparse 0: a dense layer)."""

    _fields_ = [
        ("sparse", _I64),
        *((name, _PTR) for name in ("router", "router_bias")),
        *((name, ctypes.POINTER(BlockWeight)) for name in ("gate_up", "down")),
        *((name, _PTR) for name in ("gate_up_bias", "down_bias")),
        # The shared expert (Qwen2-MoE): its blocks, NULL: none; its gate's float32 row.
        *((name, ctypes.POINTER(BlockWeight)) for name in ("shared_gate_up", "shared_down")),
        ("shared_gate", _PTR),
    ]


class DecodeModel(ctypes.Structure):
    """struct decode_model."""

    _fields_ = [
        *((name, _I64) for name in ("hidden", "intermediate", "num_layers", "num_heads")),
        *((name, _I64) for name in ("num_kv_heads", "head_dim", "vocab")),
        ("eps", _F64),
        ("scale", _F64),
        *((name, _PTR) for name in ("embed", "final_norm")),
        ("lm_head", ctypes.POINTER(BlockWeight)),
        ("norms", _PTR),
        ("weights", ctypes.POINTER(BlockWeight)),
        *((name, _PTR) for name in ("rope_tables", "windows", "qkv_biases", "qk_norms")),
        *((name, _PTR) for name in ("post_norms", "sinks", "o_biases")),
        ("activation", _I64),
        ("embed_scale", _F64),
        ("moe_layers", ctypes.POINTER(MoeLayer)),
        *((name, _I64) for name in ("num_experts", "experts_per_token", "expert_intermediate")),
        *((name, _I64) for name in ("router", "normalize_topk", "expert_activation")),
        *((name, _F64) for name in ("swiglu_alpha", "swiglu_limit")),
        ("lora", _PTR),  # NativeLora's table (native_lora.py); 0: no adapters
        *((name, _I64) for name in ("lora_rank", "lora_slots")),
        ("lora_ranks", _PTR),  # int32 [slots]: LoraSlots.ranks
        ("lora_bf16", _I64),  # 1: the store is bfloat16
        ("shared_intermediate", _I64),  # a shared expert's width; 0: none
    ]


class DecodeBatch(ctypes.Structure):
    """struct decode_batch."""

    _fields_ = [
        ("num_tokens", _I64),
        *((name, _PTR) for name in ("token_ids", "positions", "slot_mapping")),
        *((name, _PTR) for name in ("block_tables", "context_lens")),
        ("max_blocks", _I64),
        ("kv_cache", _PTR),
        ("kv_dtype", _I64),
        ("num_blocks", _I64),
        ("block_size", _I64),
        ("sample_rows", _PTR),
        ("num_samples", _I64),
        ("logits", _PTR),
        *((name, _I64) for name in ("threads", "variant", "schedule", "vnni_from_m", "spin")),
        ("chained", _I64),
        ("row_slots", _PTR),  # int32 [T]; 0 (NULL): every row is the base
        ("bf16_from_m", _I64),  # BF16 rows take the bf16 panels from it; 0: never
    ]
