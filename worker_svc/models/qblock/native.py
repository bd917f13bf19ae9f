"""The q4_1 own forward's decode steps in one native call (kernels/decode_step.c).

A decode step of the Python forward (models/forward/decoder.py on QBlockLinear
projections) is
~600 small torch operators and a ctypes call per layer for attention: at batch 1 they
cost more than the projections themselves. Where a step's tokens are all decodes and
attention is the CPU backend's paged pool, `NativeDecode` runs every layer, the final
norm and the LM head in one C call with one OpenMP parallel region, and returns the
float32 logits of the sampled rows; sampling stays in Python. Any other step (a
prefill, another backend, a traced forward) returns None and takes the Python path,
which stays the reference the native one is tested against.

The library links the block kernel's and the paged-decode kernel's own objects, each
built with its own flags, so the step multiplies by the same weights and attends with
the same loop as the Python path. CBSERVE_NATIVE_DECODE=0 turns it off at load.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from worker_svc.attention import PagedAttentionContext, cpu_kernel
from worker_svc.attention.cpu_backend import CpuAttentionBackend
from worker_svc.compute import qblock
from worker_svc.compute.qblock_stack import block_runs
from worker_svc.models.qblock.native_experts import ExpertTables
from worker_svc.models.qblock.native_layers import LayerTables, LoraTable
from worker_svc.models.qblock.native_structs import (
    KV_DTYPES,
    STEP_PROJECTIONS,
    BlockWeight,
    DecodeBatch,
    DecodeModel,
)
from worker_svc.native_build import KernelUnavailableError, build_and_load_parts

KERNELS = Path(__file__).with_name("kernels")
# Rotary and the norms round as torch's do without fused multiply-adds; only SiLU's expf
# (llama_activation.c) is built with -ffast-math, to be vectorised.
STEP_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-std=gnu11")
ACTIVATION_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=gnu11")
# The LoRA delta's dot products fuse their multiply-adds, as torch's float32 matmul does.
LORA_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=gnu11")
PARTS = (
    (KERNELS / "decode_step.c", STEP_FLAGS),
    (KERNELS / "llama_activation.c", ACTIVATION_FLAGS),
    (KERNELS / "decode_lora.c", LORA_FLAGS),
    *qblock.PARTS,
    *qblock.VNNI_PARTS,
    (cpu_kernel.SOURCE, cpu_kernel.COMPILE_FLAGS),
)
LINK_FLAGS = ("-shared", "-fopenmp", "-lm")
SCHEDULES = {"dynamic": 0, "static": 1}
# Pauses a thread spins at one of the step's barriers before it sleeps on a futex
# (kernels/step_team.h); picked by bench/native_policy.py.
BARRIER_SPIN = 2000
# From how many rows the step's BF16 projections take the vdpbf16ps panels (bfloat16
# activations, compute/kernels/qblock_bf16_panel.c) instead of the float block kernel:
# Zen 4, 2 threads, [3072, 512] and [512, 1536]: 0.089 / 0.044 ms float against 0.102 /
# 0.054 ms at M = 4, 0.163 / 0.079 against 0.099 / 0.054 at M = 8 (the panels' transpose
# is paid every call; ~400 GFLOP/s at M = 64, torch's bf16 GEMM ~320-350).
BF16_PANEL_FROM_M = 8


@functools.cache
def load_decode_kernel() -> ctypes.CDLL:
    """The compiled step; KernelUnavailableError says why not."""
    lib = build_and_load_parts("decode_step", PARTS, LINK_FLAGS)
    lib.decode_step.restype = ctypes.c_int
    lib.decode_step.argtypes = [ctypes.POINTER(DecodeModel), ctypes.POINTER(DecodeBatch)]
    return lib


# What the step computes of what an architecture may declare (DecoderSpec.features):
# everything Llama 3, Mistral, Qwen2, Qwen3, Gemma 3, Qwen3-MoE, Qwen2-MoE, Mixtral and
# gpt-oss declare (experts: kernels/decode_experts.h; sinks: decode_attention.h).
# Soft-capping (Gemma 2) is not written: such a model's decode steps would take the
# Python forward.
NATIVE_FEATURES = frozenset(
    {
        "q/k/v biases",
        "per-head q/k norms",
        "(1 + w) norms",  # the model holds the float32 multiplier, 1 already added
        "post-attention and post-MLP norms",
        "GELU-tanh",
        "a scaled embedding",
        "sliding-window layers",
        "rope scaling",
        "two rope bases",
        "mixture-of-experts layers",
        "a biased router",
        "biased experts",
        "clamped SwiGLU experts",
        "attention sinks",
        "an o_proj bias",
        "a shared expert",  # Qwen2-MoE's, gated or not (kernels/decode_shared_expert.h)
    }
)
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # decode_panels.h's ACTIVATION_*


def native_decode_disabled_reason(spec=None, features=NATIVE_FEATURES) -> str | None:
    """None when the native step runs this model's decodes, else why not."""
    if os.environ.get("CBSERVE_NATIVE_DECODE", "1") == "0":
        return "CBSERVE_NATIVE_DECODE=0"
    if spec is not None and (missing := spec.unsupported(features)):
        return f"the native step does not compute {', '.join(missing)} ({spec.architecture})"
    try:
        load_decode_kernel()
    except KernelUnavailableError as exc:
        return str(exc)
    return None


class NativeDecode:
    """A q4_1 DecoderForCausalLM's weights, as the native step reads them: prepared once,
    kept alive by the model (the structure holds their addresses)."""

    def __init__(
        self,
        model,
        variant: str = "auto",
        schedule: str = "dynamic",
        barrier_spin: int = BARRIER_SPIN,
        bf16_panels: bool | None = None,
    ):
        spec = model.spec
        if (
            model.rotaries[0].cos.dtype != torch.float32
            or model.embed_tokens.dtype != torch.float32
        ):
            raise ValueError("the native decode step computes in float32 only")
        self.variant, self.schedule = qblock.VARIANTS[variant], SCHEDULES[schedule]
        self.barrier_spin = barrier_spin
        layers = model.layers
        # A mixture layer has no dense gate/up and down: an empty weight in their place.
        projections = [
            [getattr(layer, name, None) for name in STEP_PROJECTIONS] for layer in layers
        ]
        experts = [
            p for layer in layers if layer.experts is not None for p in layer.experts.projections()
        ]
        # From as many rows as QBlockLinear (this CPU's measured threshold), and only
        # where it does (CBSERVE_QBLOCK_VNNI, and formats the VNNI kernel reads: the step
        # keeps the others on the float kernel, decode_panels.h's project).
        every = [p for row in [*projections, [model.lm_head], experts] for p in row if p]
        vnni = [run for p in every for run in block_runs(p) if run.vnni]
        self.vnni_from_m = vnni[0].vnni_from_m if vnni else 0
        flat = [p for row in projections for p in row]
        # Where every layer projection takes bfloat16 activations from some M (BF16 rows,
        # bf16 dot products: QBlockLinear's bf16_gemm_from_m), the step's BF16 rows take
        # the bf16 panels from BF16_PANEL_FROM_M rows (or the projections' own threshold,
        # if lower). Without the panels (`bf16_panels` False, a CPU without AVX-512 BF16,
        # a mixture's experts, which the panels do not read) steps of bf16_gemm_from_m
        # rows or more are left to the Python forward and its torch bfloat16 GEMM.
        bf16 = [run.bf16_gemm_from_m for p in flat if p for run in block_runs(p)]
        bf16_from_m = max(bf16) if bf16 and None not in bf16 else 0
        if bf16_panels is None:
            bf16_panels = bool(load_decode_kernel().qblock_bf16_supported())
        panels = bf16_panels and bf16_from_m > 0 and not experts
        self.bf16_from_m = min(bf16_from_m, BF16_PANEL_FROM_M) if panels else 0
        self.bf16_gemm_from_m = 0 if panels else bf16_from_m
        self._weights = (BlockWeight * len(flat))(
            *(BlockWeight() if p is None else BlockWeight.of(p) for p in flat)
        )
        self._experts = ExpertTables(model)
        dense = [i for i in range(spec.num_layers) if not spec.is_sparse(i)]
        self._lm_head = BlockWeight.of(model.lm_head)
        self._layers = LayerTables(model)
        self._model = model  # owns every tensor whose address the structure holds
        self._lora: LoraTable | None = None  # built at the first step with adapter rows
        self._struct = DecodeModel(
            hidden=spec.hidden_size,
            # The dense MLP's; a model whose layers are all mixtures has none.
            intermediate=spec.intermediate_size if dense else spec.moe.intermediate_size,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            vocab=model.lm_head.out_features,
            eps=spec.rms_norm_eps,
            scale=layers[0].scale,
            embed=model.embed_tokens.data_ptr(),
            final_norm=model.norm.weight.data_ptr(),
            lm_head=ctypes.pointer(self._lm_head),
            weights=ctypes.cast(self._weights, ctypes.POINTER(BlockWeight)),
            **self._layers.fields(),
            activation=ACTIVATIONS[spec.activation],
            embed_scale=spec.embed_scale or 0.0,
            **self._experts.fields(spec),
        )

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: PagedAttentionContext,
        sample_rows: torch.Tensor,
    ) -> torch.Tensor | None:
        """The step's logits `[len(sample_rows), vocab]`, or None when this step is not
        one the native path runs (the caller then runs the Python forward)."""
        if self.bf16_gemm_from_m and input_ids.shape[0] >= self.bf16_gemm_from_m:
            return None  # the Python forward's bfloat16 GEMM leads (see __init__)
        decodes = _plain_decodes(attention, input_ids.shape[0])
        if decodes is None:
            return None
        cache = attention.pool.cache
        # Held in names until the call returns: the structure holds only addresses.
        input_ids, positions = input_ids.contiguous(), positions.contiguous()
        sample_rows = sample_rows.to(torch.int64).contiguous()
        lora = getattr(attention, "lora", None)
        if lora is not None and not lora.is_empty and self._model.layers[0].lora is None:
            return None  # adapter rows but no slot store attached: as the Python forward
        row_slots = self._row_slots(lora, input_ids.shape[0])
        slots = attention.metadata.slot_mapping.contiguous()
        tables, lens = decodes.block_tables.contiguous(), decodes.context_lens.contiguous()
        logits = torch.empty((sample_rows.shape[0], self._struct.vocab), dtype=torch.float32)
        batch = DecodeBatch(
            num_tokens=input_ids.shape[0],
            token_ids=input_ids.data_ptr(),
            positions=positions.data_ptr(),
            slot_mapping=slots.data_ptr(),
            block_tables=tables.data_ptr(),
            context_lens=lens.data_ptr(),
            max_blocks=tables.shape[1],
            kv_cache=cache.data_ptr(),
            kv_dtype=KV_DTYPES[cache.dtype],
            num_blocks=attention.pool.num_blocks,
            block_size=attention.pool.block_size,
            sample_rows=sample_rows.data_ptr(),
            num_samples=sample_rows.shape[0],
            logits=logits.data_ptr(),
            threads=torch.get_num_threads(),
            variant=self.variant,
            schedule=self.schedule,
            vnni_from_m=self.vnni_from_m,
            spin=self.barrier_spin,
            chained=int(_shares_sequences(tables, decodes.block_tables.shape[0])),
            row_slots=0 if row_slots is None else row_slots.data_ptr(),
            bf16_from_m=self.bf16_from_m,
        )
        status = load_decode_kernel().decode_step(ctypes.byref(self._struct), ctypes.byref(batch))
        if status == -4:
            return None  # OpenMP gave fewer threads than asked: the Python path runs it
        if status != 0:
            reasons = {-1: "kernel variant not supported here", -2: "unsupported shape"}
            raise RuntimeError(f"decode_step: {reasons.get(status, 'out of memory')}")
        return logits

    def _row_slots(self, lora, num_tokens: int) -> torch.Tensor | None:
        """The step's int32 slot of each row (LoraBatch.row_slots), None where every row
        is the base; the slot store's table (DecodeModel's lora fields) is built from the
        tensors attached to the layers (lora/delta.py) the first time it is needed."""
        if lora is None or lora.is_empty:
            return None
        attached = [layer.lora for layer in self._model.layers]
        if self._lora is None or any(
            source is not now for source, now in zip(self._lora.source, attached, strict=True)
        ):
            self._lora = LoraTable(self._model)
            for name, value in self._lora.fields().items():
                setattr(self._struct, name, value)
        row_slots = lora.row_slots
        if row_slots.dtype != torch.int32 or row_slots.shape != (num_tokens,):
            raise ValueError(f"row_slots must be int32 [{num_tokens}], got {row_slots.shape}")
        return row_slots.contiguous()


def _shares_sequences(tables: torch.Tensor, rows: int) -> bool:
    """Whether two rows may attend over one block table (a sequence's rows with drafts),
    so that their K/V must all be written before any attends. Rows with one first block
    are taken as one sequence: two sequences that share a cached prefix are too, which
    only costs them the barrier the ordering needs."""
    return rows > 1 and int(torch.unique(tables[:, 0]).numel()) < rows


def attends_with(backend, pool) -> bool:
    """Whether the native step can attend a step of this backend and pool: the CPU
    kernel's, over a float32 or float16 pool in CPU memory."""
    cache = pool.cache
    return (
        isinstance(backend, CpuAttentionBackend)
        and cache.dtype in KV_DTYPES
        and cache.device.type == "cpu"
        and cache.is_contiguous()
    )


def _plain_decodes(attention: PagedAttentionContext, num_tokens: int):
    """The step's KernelDecodes when every one of its tokens is a decode attended by the
    CPU kernel over a float32 or float16 pool, in flat-batch order; else None."""
    if not attends_with(attention.backend, attention.pool):
        return None
    metadata = attention.metadata
    if metadata.prefills or len(metadata.decodes) != 1:
        return None
    decodes = metadata.decodes[0]
    if not isinstance(decodes.tokens, slice) or decodes.tokens != slice(0, num_tokens):
        return None
    return decodes
