"""Baseline: transformers' own static batched `generate` on the benchmark workload.

    python -m bench.hf_baseline                          # float32 and bfloat16, one batch of 64
    python -m bench.hf_baseline --dtype float32 --batch-size 16 --out out/hf.json

What a server without continuous batching does: the prompts are left-padded into
batches, and each batch decodes until its longest request is done, so a request
that asked for 16 tokens rides along for up to 256 steps. Only the tokens each
request asked for count as useful output; the rest is reported as `generated`.
Greedy, EOS ignored, the same prompts as bench.throughput.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from bench.report import markdown_table, write_json
from bench.workload import BenchRequest, describe, make_workload
from common.defaults import converted_model_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _left_padded(batch: list[BenchRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(r.prompt_len for r in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):
        input_ids[row, width - request.prompt_len :] = torch.tensor(request.prompt_token_ids)
        attention_mask[row, width - request.prompt_len :] = 1
    return input_ids, attention_mask


def _generate(model, batch: list[BenchRequest], pad_id: int, max_new_tokens: int) -> int:
    input_ids, attention_mask = _left_padded(batch, pad_id)
    # EOS ignored: generate fills an unset eos_token_id from the model's config, so
    # min_new_tokens is what keeps every row going for exactly max_new_tokens.
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
    )
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config
        )
    return (output.shape[1] - input_ids.shape[1]) * len(batch)


def run(model_dir: Path, dtype: str, requests: list[BenchRequest], batch_size: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype])
    model.eval()
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        eos = model.generation_config.eos_token_id
        pad_id = eos[0] if isinstance(eos, list) else (eos or 0)
    # Warm-up outside the timing, as bench.throughput does.
    _generate(model, requests[:2], pad_id, 4)
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    generated = 0
    started = time.perf_counter()
    for batch in batches:
        longest = max(r.max_tokens for r in batch)
        produced = _generate(model, batch, pad_id, longest)
        if produced != longest * len(batch):
            raise RuntimeError(f"generate stopped early: {produced} of {longest * len(batch)}")
        generated += produced
    wall = time.perf_counter() - started
    useful = sum(r.max_tokens for r in requests)
    prompt = sum(r.prompt_len for r in requests)
    return {
        "dtype": dtype,
        "batch_size": batch_size,
        "torch_threads": torch.get_num_threads(),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(requests) / wall, 3),
        "useful_output_tokens": useful,
        "generated_tokens": generated,
        "useful_output_tokens_per_s": round(useful / wall, 2),
        "generated_tokens_per_s": round(generated / wall, 2),
        "total_tokens_per_s": round((prompt + useful) / wall, 2),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hf_baseline", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--dtype", action="append", choices=list(DTYPES), help="repeatable; default: both"
    )
    parser.add_argument("--model", type=Path, default=None, help="HF model directory")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--batch-size", type=int, default=None, help="default: all prompts")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = args.model or converted_model_dir()
    requests = make_workload(args.num_prompts, args.seed, model_dir)
    batch_size = args.batch_size or len(requests)
    runs = {}
    for dtype in args.dtype or list(DTYPES):
        print(f"transformers generate, {dtype}, batch {batch_size} ...", file=sys.stderr)
        runs[dtype] = run(model_dir, dtype, requests, batch_size)
    print(markdown_table(runs))
    if args.out:
        payload = {
            "benchmark": "transformers static batched generate",
            "command": " ".join(["python -m bench.hf_baseline", *(argv or sys.argv[1:])]),
            "workload": describe(requests, args.seed),
            "runs": runs,
        }
        write_json(args.out, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
