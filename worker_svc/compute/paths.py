"""The compute paths a worker can run: the precision of weights and activations, and
the CPU features each needs to be worth running.

- float32: float32 weights and activations, no quantization. The reference mode:
  token-identical to transformers' `generate`, and what every other path is
  checked against (logprobs-close, tests/worker/test_compute_paths_close.py).
- bfloat16 / float16: weights and activations in that type; on a CPU only where it
  computes them natively (avx512_bf16 / AMX, avx512_fp16 / AMX-FP16). Elsewhere
  torch emulates them at a few GFLOP/s, slower than float32 by 6-25x (measured).
- int8: int8 weights (per output channel) times int8 activations (per token) in
  fbgemm, on the CPU's 8-bit dot products: AVX2's vpmaddubsw at least, VNNI or AMX
  where present. Norms, rotary, attention and the KV cache stay float32. Needs the
  own forward (transformers' modules keep their float32 matmuls).
- q4_1: weights in GGUF's own blocks (the shipped model's Q4_1 projections and Q8_0
  head; Q8_0 quantized at load for a float-only model) through the own C kernels
  (compute/qblock.py): the float32 weights, read from a sixth of the bytes. Small M:
  float32 activations (plain C everywhere, AVX2 / AVX-512 where present); large M on
  AVX-512 VNNI: 16-bit activation blocks of 32 in integer dot products. Passes the
  accuracy gate (bench/accuracy.py); needs a C compiler.
- bfloat16-weights: q4_1's kernels and native decode step, but a float checkpoint's
  weights are kept as BF16 rows instead of quantized to Q8_0 at load: a bfloat16
  checkpoint's very weights (half float32's bytes), widened exactly to float32 in
  registers and multiplied by float32 activations. On a GGUF (its own blocks), as
  q4_1. `auto` offers it for a bfloat16 checkpoint only (compute/weight_source.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ComputePath:
    name: str
    # Activations, norms, attention and the KV cache run in this dtype.
    activation_dtype: torch.dtype
    # On a CPU, at least one of these flags must be present; empty: always runs.
    cpu_needs_any: tuple[str, ...]
    runs_on_cuda: bool
    needs_own_forward: bool
    # Whether `--dtype auto` may take it. int8 may not: on SmolLM2-135M it passes
    # vLLM's logprobs-closeness check, yet its greedy reply to the README's own chat
    # example ("What is the capital of France?") is nonsense where float32 says Paris.
    # It stays one flag away (--dtype int8) until its accuracy is fixed.
    auto_eligible: bool = True
    # Runs the own C block kernels (compute/qblock.py): needs a C compiler.
    blocks: bool = False

    def missing_on_cpu(self, flags: frozenset[str]) -> str | None:
        """Why this CPU cannot run the path (the missing feature), or None."""
        if not self.cpu_needs_any or any(flag in flags for flag in self.cpu_needs_any):
            return None
        return (
            f"--dtype {self.name} needs a CPU with {' or '.join(self.cpu_needs_any)}, "
            "and this CPU has none of them"
        )


PATHS: dict[str, ComputePath] = {
    path.name: path
    for path in (
        ComputePath("float32", torch.float32, (), runs_on_cuda=True, needs_own_forward=False),
        ComputePath(
            "bfloat16",
            torch.bfloat16,
            ("avx512_bf16", "amx_bf16"),
            runs_on_cuda=True,
            needs_own_forward=False,
        ),
        ComputePath(
            "float16",
            torch.float16,
            ("avx512_fp16", "amx_fp16"),
            runs_on_cuda=True,
            needs_own_forward=False,
        ),
        ComputePath(
            "int8",
            torch.float32,
            ("avx2", "avx512_vnni", "avx_vnni", "amx_int8"),
            runs_on_cuda=False,
            needs_own_forward=True,
            auto_eligible=False,
        ),
        ComputePath(
            "q4_1", torch.float32, (), runs_on_cuda=False, needs_own_forward=True, blocks=True
        ),
        ComputePath(
            "bfloat16-weights",
            torch.float32,
            (),
            runs_on_cuda=False,
            needs_own_forward=True,
            blocks=True,
        ),
    )
}
