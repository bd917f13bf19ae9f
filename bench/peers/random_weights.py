"""Random weights for test and benchmark checkpoints (the architecture tests' models, the
random Qwen3 the format benchmarks quantize): matrices N(0, 0.08^2), so that greedy
tokens are decided by clear margins; norm weights 1 + N(0, 0.2^2); other vectors
(biases) N(0, 0.1^2). Seeded: the same seed gives the same model."""

from __future__ import annotations


def randomize(model, seed: int) -> None:
    """Every parameter of `model` (a torch module) replaced in place."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if param.dim() > 1:
                param.copy_(noise * 0.08)
            elif "norm" in name:
                param.copy_(param + 0.2 * noise)
            else:
                param.copy_(noise * 0.1)
