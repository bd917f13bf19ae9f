"""The roofline line of `cbserve bench`: how far each column is from the machine.

Before any system runs, the projections of the path the worker will choose are
timed at M=64 (bench.micro.kernels, the worker's thread count). A generated token
costs the model's projection FLOPs (2 x the projection parameters, the LM head
included), so that GFLOP/s caps output tokens/s for the projections alone:
attention, norms and the serving loop only lower the real figure. Each column's
output tok/s is then shown as a share of that ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass

ROWS = 64


@dataclass(frozen=True)
class Roofline:
    path: str
    threads: int
    gflops: float  # projections at M=ROWS
    flops_per_token: float

    @property
    def ceiling_tokens_per_s(self) -> float:
        return self.gflops * 1e9 / self.flops_per_token

    def line(self, throughputs: dict[str, float]) -> str:
        shares = ", ".join(
            f"{label} {value / self.ceiling_tokens_per_s:.0%}"
            for label, value in throughputs.items()
        )
        return (
            f"Roofline: {self.path} projections at M={ROWS}, {self.threads} threads: "
            f"{self.gflops:.1f} GFLOP/s -> at most {self.ceiling_tokens_per_s:,.0f} output "
            f"tok/s ({self.flops_per_token / 1e9:.3f} GFLOP a token)"
            + (f"; output tok/s as a share of it: {shares}" if shares else "")
        )


def flops_per_token(shapes: dict[str, tuple[int, int, int]]) -> float:
    return sum(2.0 * out_f * in_f * count for out_f, in_f, count in shapes.values())


def shapes_of(model) -> dict[str, tuple[int, int, int]]:
    """The projection shapes of a model directory or a GGUF file (its metadata)."""
    if str(model).endswith(".gguf"):
        from worker_svc.compute.model_shapes import read_projection_shapes

        read = read_projection_shapes(model)
        if read is None:
            raise ValueError(f"cannot read the projection shapes of {model}")
        names = ("qkv", "o", "gate_up", "down")
        rows = {n: (*s, read.layers) for n, s in zip(names, read.layer_projections(), strict=True)}
        return {**rows, "lm_head": (*read.head(), 1)}
    from transformers import AutoConfig

    from bench.micro.kernels import projection_shapes

    return projection_shapes(AutoConfig.from_pretrained(str(model)))


def measure(model_dir, dtype: str, threads: int | None) -> Roofline:
    """Times the path `--dtype dtype` resolves to on this CPU, as a worker would."""
    import torch

    from bench.micro.kernels import step_gflops
    from worker_svc.compute.cpu_features import cpu_flags
    from worker_svc.compute.selection import select_path

    path, _ = select_path(dtype, "cpu", cpu_flags())
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        shapes = shapes_of(model_dir)
        gflops, _ = step_gflops(path.name, shapes, ROWS, repeats=10)
        return Roofline(path.name, torch.get_num_threads(), gflops, flops_per_token(shapes))
    finally:
        torch.set_num_threads(before)
