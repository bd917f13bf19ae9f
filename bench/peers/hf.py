"""Baseline: transformers' own batched `generate` on the benchmark's requests, in this process.

What serving without any scheduler does: the requests (all arrived at once) are cut
into batches in arrival order, each batch is left-padded and decodes until its
longest request is done, and the next batch starts only then. A request that asked
for 16 tokens rides along for up to 256 steps; only the tokens each request asked
for count as output. Greedy, EOS ignored (min_new_tokens), the same prompt token ids.

Per-request times come from a streamer that stamps every decode step, so TTFT, TPOT,
ITL and E2E are measured exactly as for cbserve, from the moment all requests
arrived (the start of the run): a request in the third batch waits for two batches.

    python -m bench.peers.hf --dataset random --num-prompts 8 --dtype float32
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.harness.metrics import RequestTiming
from bench.harness.progress import Progress
from bench.harness.workload import BenchRequest

DTYPES = ("float32", "bfloat16")


class _StepClock:
    """A generate() streamer: the first put() is the prompt, each later one a step."""

    def __init__(self) -> None:
        self.step_times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if self._prompt_seen:
            self.step_times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def _left_padded(batch: list[BenchRequest], pad_id: int):
    import torch

    width = max(r.prompt_len for r in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):
        input_ids[row, width - request.prompt_len :] = torch.tensor(request.prompt_token_ids)
        attention_mask[row, width - request.prompt_len :] = 1
    return input_ids, attention_mask


def _generate(model, batch: list[BenchRequest], pad_id: int, new_tokens: int) -> list[float]:
    """Runs one batch for exactly `new_tokens` steps; returns each step's finish time."""
    import torch
    from transformers import GenerationConfig

    input_ids, attention_mask = _left_padded(batch, pad_id)
    # generate fills an unset eos_token_id from the model's config, so min_new_tokens
    # is what keeps every row going (EOS ignored, as the cbserve requests do).
    config = GenerationConfig(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id
    )
    clock = _StepClock()
    with torch.inference_mode():
        model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            streamer=clock,
        )
    if len(clock.step_times) != new_tokens:
        raise RuntimeError(f"generate ran {len(clock.step_times)} steps, not {new_tokens}")
    return clock.step_times


def load_model(model_dir: Path, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    pad_id = model.generation_config.pad_token_id
    if pad_id is None:
        eos = model.generation_config.eos_token_id
        pad_id = eos[0] if isinstance(eos, list) else (eos or 0)
    return model, pad_id


def run(
    model_dir: Path,
    dtype: str,
    requests: list[BenchRequest],
    batch_size: int,
    progress: bool = True,
) -> tuple[list[RequestTiming], float, dict]:
    """Timings in request order, wall seconds, and what was run."""
    import torch

    model, pad_id = load_model(model_dir, dtype)
    _generate(model, requests[:2], pad_id, 4)  # warm-up outside the timing
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    bar = Progress(len(requests), f"transformers generate ({dtype})") if progress else None
    timings: list[RequestTiming] = []
    started = time.perf_counter()
    for batch in batches:
        step_times = _generate(model, batch, pad_id, max(r.max_tokens for r in batch))
        for request in batch:
            chunks = [(at, 1) for at in step_times[: request.max_tokens]]
            timings.append(RequestTiming(request.prompt_len, started, chunks, "LENGTH"))
        if bar:
            bar.update(len(batch))
    wall = time.perf_counter() - started
    if bar:
        bar.close()
    info = {"dtype": dtype, "batch_size": batch_size, "torch_threads": torch.get_num_threads()}
    return timings, wall, info


def main(argv: list[str] | None = None) -> int:
    import argparse

    from bench.harness.metrics import summarize
    from bench.harness.report import markdown_table
    from bench.harness.workload import make_workload
    from common.defaults import converted_model_dir

    parser = argparse.ArgumentParser(prog="python -m bench.peers.hf")
    parser.add_argument("--dataset", choices=("sharegpt", "random"), default="random")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-output-tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)
    model_dir = args.model or converted_model_dir()
    requests = make_workload(
        args.dataset,
        args.num_prompts,
        args.seed,
        model_dir,
        max_output_tokens=args.max_output_tokens,
    )
    timings, wall, _ = run(model_dir, args.dtype, requests, args.batch_size)
    print(markdown_table({f"hf {args.dtype}": summarize(timings, wall)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
