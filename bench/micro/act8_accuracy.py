"""Does 8-bit activation quantization keep the accuracy gate, projection kind by kind?
A simulation, no kernel: the q4_1 path's Python forward with the input of the chosen
projections quantized and dequantized as llama.cpp's Q8_0/Q8_1 do it (per row, blocks
of 32: d = max|x| / 127, q = round(x / d) in [-127, 127], x ~= d q), then the gate's
two measures (bench/accuracy/gate.py) against float32:

    .venv/bin/python -m bench.micro.act8_accuracy [--mixes all,no-down,qkv+gate_up]
        [--texts 16] [--threads 2] [--json FILE]

A mix is a `+`-joined list of projection kinds (qkv, o, gate_up, down, lm_head), or one
of the names in MIXES; `none` is the q4_1 path as it is (16-bit activation blocks at
large M, float32 below). The native decode step is off in every run (it would bypass
the hooks), so `none` is the Python q4_1 path's own row. Each row prints as it is done;
the table at the end has the perplexity ratio, the replies equal to float32's first
12 tokens (of 16 questions) and the share of a 64-row decode step's multiplies the mix
covers. The scale stays float32 here (llama.cpp rounds Q8_1's d to float16); a kernel
that keeps it in float32 computes these same products up to summation order.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

from bench.accuracy.gate import GATE_PPL_RATIO, GATE_REPLIES, REPLY_TOKENS

KINDS = ("qkv", "o", "gate_up", "down", "lm_head")
LAYER_ATTRS = {"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj"}
MIXES = {
    "none": (),
    "all": KINDS,
    "no-head": ("qkv", "o", "gate_up", "down"),
    "no-down": ("qkv", "o", "gate_up", "lm_head"),
    "no-down-head": ("qkv", "o", "gate_up"),
    "qkv+gate_up": ("qkv", "gate_up"),
}
DEFAULT_MIXES = "none,all,no-head,no-down,no-down-head,qkv+gate_up,qkv,o,gate_up,down,lm_head"


def quantize_dequantize_8bit(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x `[..., K]` float32 as symmetric int8 blocks of `block` would give it back."""
    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = (blocks * inv).round().clamp_(-127, 127)
    return (q * d).reshape(x.shape)


class Act8Input(nn.Module):
    """A projection whose input is first rounded to 8-bit blocks."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(quantize_dequantize_8bit(x))


def set_mix(model: nn.Module, kinds: tuple[str, ...]) -> None:
    """In place: the projections of `kinds` take 8-bit inputs, the others their own."""

    def wrapped(module: nn.Module, on: bool) -> nn.Module:
        inner = module.inner if isinstance(module, Act8Input) else module
        return Act8Input(inner) if on else inner

    for layer in model.layers:
        for kind, attr in LAYER_ATTRS.items():
            setattr(layer, attr, wrapped(getattr(layer, attr), kind in kinds))
    model.lm_head = wrapped(model.lm_head, "lm_head" in kinds)


def step_multiplies(config: dict, rows: int = 64) -> dict[str, int]:
    """Multiply-adds per kind in a decode step of `rows` rows (every row samples)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q = config["num_attention_heads"] * head_dim
    kv = config["num_key_value_heads"] * head_dim
    layers = config["num_hidden_layers"]
    per_row = {
        "qkv": layers * hidden * (q + 2 * kv),
        "o": layers * q * hidden,
        "gate_up": layers * hidden * 2 * inter,
        "down": layers * inter * hidden,
        "lm_head": hidden * config["vocab_size"],
    }
    return {kind: rows * n for kind, n in per_row.items()}


def parse_mix(name: str) -> tuple[str, ...]:
    if name in MIXES:
        return MIXES[name]
    kinds = tuple(name.split("+"))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown projection kind(s) {unknown}: use {KINDS} or {list(MIXES)}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.micro.act8_accuracy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--mixes", default=DEFAULT_MIXES)
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--max-text-tokens", type=int, default=384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    mixes = {name: parse_mix(name) for name in args.mixes.split(",")}

    from bench.accuracy.data import QUESTIONS, heldout_texts
    from bench.accuracy.eval import greedy_replies, perplexity
    from common.defaults import default_model_path
    from scheduler_svc.api.tokenizer import ChatTurn, Tokenizer
    from worker_svc.compute.cpu_features import cpu_name
    from worker_svc.model_loader import load_model

    torch.set_num_threads(args.threads)
    model_path = args.model or default_model_path()
    tokenizer = Tokenizer(model_path)
    texts = heldout_texts(lambda t: tokenizer.encode(t, False), args.texts, args.max_text_tokens)
    prompts = [tokenizer.encode_chat([ChatTurn("user", q)]) for q in QUESTIONS]

    def measure(loaded) -> tuple[float, list[list[int]]]:
        return perplexity(loaded, texts), greedy_replies(loaded, prompts, REPLY_TOKENS)

    started = time.perf_counter()
    reference = load_model(model_path, "float32", torch.device("cpu"))
    ref_ppl, ref_replies = measure(reference)
    config = reference.model.spec
    del reference
    print(f"# float32: perplexity {ref_ppl:.4f} ({time.perf_counter() - started:.0f} s)")
    loaded = load_model(model_path, "q4_1", torch.device("cpu"))
    loaded.model.native_decode = None  # it would bypass the hooks
    print(f"# q4_1 weights: {getattr(loaded.model, 'qblock_source', '')}")
    shares = step_multiplies(_config_dict(config, loaded.model))
    total = sum(shares.values())
    rows = {}
    for name, kinds in mixes.items():
        started = time.perf_counter()
        set_mix(loaded.model, kinds)
        ppl, replies = measure(loaded)
        equal = sum(a == b for a, b in zip(replies, ref_replies, strict=True))
        ratio = ppl / ref_ppl
        rows[name] = {
            "kinds": list(kinds),
            "perplexity": ppl,
            "ratio": ratio,
            "equal_replies": equal,
            "passes": ratio <= GATE_PPL_RATIO and equal >= GATE_REPLIES,
            "step_share": sum(shares[k] for k in kinds) / total,
            "first_reply": tokenizer.decode(replies[0]),
        }
        print(
            f"# {name}: perplexity {ppl:.4f} ({ratio:.4f}x), replies {equal}/{len(replies)} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )
    print(f"\n{cpu_name()}, {args.threads} threads; {len(texts)} texts; float32 {ref_ppl:.4f}")
    print("| 8-bit inputs of | share of a 64-row step's multiplies | perplexity | vs float32 "
          "| replies | gate | reply to the first question |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---|")
    for name, row in rows.items():
        reply = row["first_reply"].replace("\n", " ").replace("|", "/")
        print(
            f"| {name} | {row['step_share']:.1%} | {row['perplexity']:.4f} | {row['ratio']:.4f}x "
            f"| {row['equal_replies']}/{len(prompts)} | {'pass' if row['passes'] else 'FAIL'} "
            f"| {reply} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"float32": ref_ppl, "rows": rows}, handle, indent=1)
    return 0


def _config_dict(spec, model) -> dict:
    """The shapes step_multiplies reads, from the declaration and the built model."""
    layer = model.layers[0]
    return {
        "hidden_size": layer.o_proj.out_features,
        "intermediate_size": layer.down_proj.in_features,
        "head_dim": spec.head_dim,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "num_hidden_layers": len(model.layers),
        "vocab_size": model.lm_head.out_features,
    }


if __name__ == "__main__":
    raise SystemExit(main())
