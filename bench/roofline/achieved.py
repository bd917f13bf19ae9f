"""What the worker's own compute classes achieve on the default model's shapes, and
which instruction each one's kernel rests on (the peak it is held to).

Projections: layer 0's four fused projections and the LM head of the shipped GGUF,
built as the worker builds them (compute/qblock_stack.qblock_projection on the file's
own blocks; QBlockLinear on BF16 rows for bfloat16-weights; compute/projections'
dense classes for torch float32 and bfloat16), each timed alone and summed as a step
runs them (every layer's four, the head once). Attention: one layer's paged decode
(attention/cpu_kernel.py) over a scattered pool, as the worker's float16 default.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import torch

from bench.roofline.report import Achieved, attention_flops, attention_kv_bytes, matmul_flops
from worker_svc.attention.cpu_kernel import paged_decode_attention
from worker_svc.compute.linear import DenseLinear
from worker_svc.compute.model_shapes import ProjectionShapes
from worker_svc.compute.paths import PATHS
from worker_svc.compute.projections import make_projection
from worker_svc.compute.qblock import BF16
from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_stack import block_runs, qblock_projection
from worker_svc.models.architectures import load_architecture
from worker_svc.models.qblock.gguf_blocks import read_gguf_blocks

PROJECTIONS = ("qkv", "o", "gate_up", "down")


def fma_here(flags: frozenset[str]) -> str | None:
    """The widest float32 FMA this CPU has: what the float kernels and torch's float32
    GEMM issue."""
    if "avx512f" in flags:
        return "fma-zmm"
    return "fma-ymm" if {"avx2", "fma"} <= flags else None


def qblock_kernel_at(projection, rows: int, flags: frozenset[str]) -> tuple[str, str | None]:
    """(kernel, instruction) a block projection runs at `rows`: the choice
    QBlockLinear.forward makes, read from its own thresholds (its first run's, for a
    stack: the runs share M)."""
    run = block_runs(projection)[0]
    bf16_from = getattr(run, "bf16_gemm_from_m", None)
    if bf16_from is not None and rows >= bf16_from:
        return "BF16 rows, torch bf16 GEMM", "vdpbf16ps"
    if run.vnni and rows >= run.vnni_from_m:
        return "VNNI kernel", "vpdpwssd"
    if run.dense_from_m is not None and rows >= run.dense_from_m:
        return "dequant + torch f32 GEMM", fma_here(flags)
    return "float block kernel", fma_here(flags)


def torch_kernel(dtype: torch.dtype, flags: frozenset[str]) -> tuple[str, str | None]:
    if dtype == torch.bfloat16 and "avx512_bf16" in flags:
        return "torch bf16 GEMM", "vdpbf16ps"
    return f"torch {str(dtype).removeprefix('torch.')} GEMM", fma_here(flags)


def timed(call: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(best, median) seconds of one call, after two untimed ones."""
    for _ in range(2):
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def build_paths(gguf_path, shapes: ProjectionShapes, flags: frozenset[str]) -> tuple[dict, list]:
    """path -> {projection name: module}, and the paths not timed here with why."""
    blocks = read_gguf_blocks(gguf_path, load_architecture("llama"), layers=(0,))
    q4 = {name: qblock_projection(blocks.layers[0][name]) for name in PROJECTIONS}
    q4["lm_head"] = QBlockLinear(*blocks.lm_head, dense_from_m=None)  # as models/qblock/build
    expected = dict(zip(PROJECTIONS, shapes.layer_projections(), strict=True))
    expected["lm_head"] = shapes.head()
    for name, module in q4.items():
        if (module.out_features, module.in_features) != expected[name]:
            raise ValueError(f"{gguf_path}: {name} is not {expected[name]} as the config says")
    weights = {name: module.dequantized() for name, module in q4.items()}
    paths = {"q4_1 (GGUF blocks)": q4}
    paths["bfloat16-weights (BF16)"] = {
        name: QBlockLinear.from_float(
            w, BF16, **({"dense_from_m": None} if name == "lm_head" else {})
        )
        for name, w in weights.items()
    }
    skipped = []
    for dtype in ("float32", "bfloat16"):
        missing = PATHS[dtype].missing_on_cpu(flags)
        if missing:
            skipped.append(f"torch {dtype}: {missing} (torch would emulate it)")
            continue
        paths[f"torch {dtype}"] = {n: make_projection(w, dtype) for n, w in weights.items()}
    return paths, skipped


def time_path(
    what: str,
    modules: dict,
    rows: int,
    shapes: ProjectionShapes,
    flags: frozenset[str],
    repeats: int,
) -> Achieved:
    """One step's projections at `rows`: every layer's four and the head once."""
    counts = {name: shapes.layers for name in PROJECTIONS} | {"lm_head": 1}
    flops = best = median = 0.0
    per_shape = {}
    generator = torch.Generator().manual_seed(rows)
    for name, module in modules.items():
        dtype = module.weight.dtype if isinstance(module, DenseLinear) else torch.float32
        x = torch.randn(rows, module.in_features, generator=generator).to(dtype)
        with torch.inference_mode():
            low, mid = timed(lambda m=module, x=x: m(x), repeats)
        call_flops = matmul_flops(rows, module.out_features, module.in_features)
        per_shape[name] = call_flops / mid / 1e9
        flops += call_flops * counts[name]
        best += low * counts[name]
        median += mid * counts[name]
    sample = modules["qkv"]
    if isinstance(sample, DenseLinear):
        kernel, instruction = torch_kernel(sample.weight.dtype, flags)
    else:
        kernel, instruction = qblock_kernel_at(sample, rows, flags)
    weight_bytes = sum(_weight_bytes(m) * counts[name] for name, m in modules.items())
    return Achieved(what, rows, kernel, instruction, flops, median, best, weight_bytes, per_shape)


def _weight_bytes(projection) -> int:
    """The bytes of weights one call reads: a dense weight's, or the blocks'."""
    if isinstance(projection, DenseLinear):
        return projection.weight.numel() * projection.weight.element_size()
    return sum(run.blocks.numel() for run in block_runs(projection))


def time_attention(
    shapes: ProjectionShapes,
    head_dim: int,
    sequences: int,
    context: int,
    flags: frozenset[str],
    repeats: int,
    block_size: int = 16,
    cache_dtype: torch.dtype = torch.float16,
) -> Achieved:
    """One layer's paged decode attention: `sequences` queries of `context` keys each,
    their blocks scattered over a pool twice the size needed, as in a busy worker."""
    heads, kv_heads = shapes.q_width // head_dim, shapes.kv_width // head_dim
    per_sequence = -(-context // block_size)
    pool_blocks = 2 * sequences * per_sequence
    free = list(range(pool_blocks))
    random.Random(0).shuffle(free)
    tables = torch.tensor(
        [[free.pop() for _ in range(per_sequence)] for _ in range(sequences)], dtype=torch.int32
    )
    generator = torch.Generator().manual_seed(0)
    cache_shape = (pool_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(cache_shape, generator=generator).to(cache_dtype)
    v_cache = torch.randn(cache_shape, generator=generator).to(cache_dtype)
    query = torch.randn(sequences, heads, head_dim, generator=generator)
    lens = [context] * sequences
    context_lens = torch.tensor(lens, dtype=torch.int32)
    best, median = timed(
        lambda: paged_decode_attention(
            query, k_cache, v_cache, tables, context_lens, head_dim**-0.5
        ),
        repeats,
    )
    what = f"attention ({str(cache_dtype).removeprefix('torch.')} pool)"
    nbytes = attention_kv_bytes(lens, kv_heads, head_dim, k_cache.element_size())
    flops = attention_flops(lens, heads, head_dim)
    return Achieved(what, sequences, f"paged decode, ctx {context}", fma_here(flags), flops,
                    median, best, nbytes)  # fmt: skip
