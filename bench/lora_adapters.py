"""PEFT LoRA adapters with random weights on the default model, for the benchmark and
the tests: `cbserve bench make-adapters`.

    cbserve bench make-adapters --out-dir out/adapters --count 4 --rank 8
    cbserve serve --enable-lora --max-loras 4 --lora-modules \\
        a0=out/adapters/a0 a1=out/adapters/a1 a2=out/adapters/a2 a3=out/adapters/a3
    cbserve bench --dataset random --num-prompts 64 --max-concurrency 16 \\
        --server localhost:50051 --lora-modules a0 a1 a2 a3

PEFT's own initialization makes B zero, so a fresh adapter changes nothing and would
hide a missing delta. Here A and B are both drawn at random (seeded), with B scaled so
that the delta changes greedy replies without drowning the base model. Each directory
is what `save_pretrained` writes: adapter_config.json and adapter_model.safetensors.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

# The attention projections (vLLM's and PEFT's usual targets) and every projection of
# a Llama-style decoder.
ATTENTION_TARGETS = ("q_proj", "v_proj")
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# B's entries are drawn with this standard deviation (before alpha / r): large enough
# to move greedy tokens of the default model, small enough to keep its replies text.
DEFAULT_B_STD = 0.05


def make_adapter(
    out_dir: Path | str,
    *,
    rank: int = 8,
    targets: Sequence[str] = ATTENTION_TARGETS,
    seed: int = 0,
    model_dir: Path | str | None = None,
    alpha: float | None = None,
    b_std: float = DEFAULT_B_STD,
    base_model=None,
) -> Path:
    """Writes one adapter of `rank` on `targets` into out_dir; returns out_dir.
    base_model: a transformers model already loaded (float32), reused across calls
    (it is left unchanged); else model_dir's is loaded (the default model's)."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = base_model if base_model is not None else load_base(model_dir)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_A" in name:
                # Rows of A unit-scaled over the input: x @ A.T keeps x's magnitude.
                std = 1.0 / math.sqrt(parameter.shape[1])
            elif "lora_B" in name:
                std = b_std
            else:
                continue
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * std)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(out)
    # The base model gets its own modules back, for the next adapter.
    peft_model.unload()
    return out


def load_base(model_dir: Path | str | None = None):
    """The base model in float32, as PEFT and the reference tests read it."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.defaults import converted_model_dir

    path = Path(model_dir) if model_dir is not None else converted_model_dir()
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def make_adapters(
    out_dir: Path | str,
    count: int,
    *,
    prefix: str = "a",
    rank: int = 8,
    targets: Sequence[str] = ATTENTION_TARGETS,
    seed: int = 0,
    model_dir: Path | str | None = None,
) -> dict[str, Path]:
    """`count` adapters, name -> directory (prefix0, prefix1, ...), each its own seed."""
    model = load_base(model_dir)
    made = {}
    for index in range(count):
        name = f"{prefix}{index}"
        made[name] = make_adapter(
            Path(out_dir) / name,
            rank=rank,
            targets=targets,
            seed=seed + index,
            base_model=model,
        )
    return made


def main(argv: list[str] | None = None, prog: str = "cbserve bench make-adapters") -> int:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0].replace("\n", " ")
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("out/adapters"), help="where the adapters go"
    )
    parser.add_argument("--count", type=int, default=4, help="how many adapters (default 4)")
    parser.add_argument("--prefix", default="a", help="names: PREFIX0, PREFIX1, ... (default a)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank r (default 8)")
    parser.add_argument(
        "--targets",
        default=",".join(ATTENTION_TARGETS),
        help=f"comma-separated modules (default {','.join(ATTENTION_TARGETS)}; "
        f"every projection: {','.join(ALL_TARGETS)})",
    )
    parser.add_argument("--seed", type=int, default=0, help="adapter i uses seed + i")
    parser.add_argument(
        "--model", type=Path, default=None, help="the base model directory (default: the default)"
    )
    args = parser.parse_args(argv)
    if args.count < 1 or args.rank < 1:
        parser.error("--count and --rank must be >= 1")
    targets = [name.strip() for name in args.targets.split(",") if name.strip()]
    made = make_adapters(
        args.out_dir,
        args.count,
        prefix=args.prefix,
        rank=args.rank,
        targets=targets,
        seed=args.seed,
        model_dir=args.model,
    )
    modules = " ".join(f"{name}={path}" for name, path in made.items())
    print(f"wrote {len(made)} adapters of rank {args.rank} on {','.join(targets)}")
    serve = f"cbserve serve --enable-lora --max-loras {len(made)} --lora-modules {modules}"
    print(f"serve them: {serve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
