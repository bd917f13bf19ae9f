"""Times one worker step in-process, and shows where it goes (torch profiler).

    .venv/bin/python -m bench.micro.step_profile [--batch 64] [--context 200 | 100:1500]
        [--prefill 0] [--threads 2] [--dtype float32] [--attention-backend auto|torch|cpu]
        [--profile] [--steps 5] [--compile] [--model PATH]

The step is what a worker runs under the serving benchmark: `batch` sequences
decoding one token each, over `context` tokens of KV (one length, or a uniform
spread LOW:HIGH as ShareGPT's chats give), plus optionally one prefill chunk of
`--prefill` tokens in the same flat batch. No gRPC, no scheduler: this is the
forward pass alone, to compare with `cbserve_step_forward_seconds` and
`cbserve_step_overhead_seconds` of a served run.

`--profile` prints torch's operator table over the timed steps; `py-spy record
--native -- .venv/bin/python -m bench.micro.step_profile` gives the Python side.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from bench.harness.workload import parse_range
from bench.micro.measure_dtype import GREEDY, make_runner, new_sequence
from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.model_runner import ModelRunner

# Room each sequence gets for the tokens its steps decode (--steps beyond it fail).
DECODE_ROOM = 64


def set_up(
    runner: ModelRunner, contexts: list[int], seed: int, decode_room: int = DECODE_ROOM
) -> list[int]:
    """Prefills one sequence per context length (minus the token each step decodes),
    with blocks for `decode_room` more tokens."""
    rng = random.Random(seed)
    bs = runner.pool.block_size
    free = list(range(runner.pool.num_blocks))
    rng.shuffle(free)
    for sid, context in enumerate(contexts):
        tokens = [rng.randrange(100, 40000) for _ in range(context - 1)]
        blocks = [free.pop() for _ in range(-(-(context + decode_room) // bs))]
        runner.execute(pb.StepPlan(new_sequences=[new_sequence(sid, tokens, blocks)]))
    return free


def step_plan(num_decodes: int, prefill: list[int], free: list[int], bs: int) -> pb.StepPlan:
    plan = pb.StepPlan(
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=sid, num_scheduled_tokens=1) for sid in range(num_decodes)
        ]
    )
    if prefill:
        blocks = free[: -(-len(prefill) // bs)]
        plan.new_sequences.append(
            pb.NewSequence(
                seq_id=10**6,
                prompt_token_ids=prefill,
                num_scheduled_tokens=len(prefill),
                block_ids=blocks,
                sampling=GREEDY,
            )
        )
        plan.finished_seq_ids.append(10**6)  # dropped at the next step's start
    return plan


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.step_profile") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", default="200", metavar="N|LOW:HIGH")
    parser.add_argument("--prefill", type=int, default=0, help="tokens of one prefill chunk")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16", "int8", "q4_1", "bfloat16-weights"),
    )
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "torch", "cpu"),
        help="as the worker's",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="as the worker's --model")
    parser.add_argument("--profile", action="store_true", help="print torch's operator table")
    parser.add_argument(
        "--compile", action="store_true", help="the worker's --compile (torch.compile)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    low, high = parse_range(args.context)
    rng = random.Random(args.seed)
    contexts = [rng.randint(low, high) for _ in range(args.batch)]
    decode_room = max(DECODE_ROOM, args.steps + 2 + 2)
    blocks_needed = sum(-(-(c + decode_room) // 16) for c in contexts) + args.prefill // 16 + 2
    runner = make_runner(
        args.dtype,
        blocks_needed,
        attention=args.attention_backend,
        compile=args.compile,
        model=args.model,
    )
    set_up_started = time.perf_counter()
    free = set_up(runner, contexts, args.seed, decode_room)
    set_up_seconds = time.perf_counter() - set_up_started
    prefill = [rng.randrange(100, 40000) for _ in range(args.prefill)]

    def one_step() -> float:
        started = time.perf_counter()
        runner.execute(step_plan(args.batch, prefill, free, runner.pool.block_size))
        return time.perf_counter() - started

    warm_up = time.perf_counter()
    for _ in range(2):  # warm-up: allocator, kernels (and with --compile, the compile)
        one_step()
    warm_up = time.perf_counter() - warm_up
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            times = [one_step() for _ in range(args.steps)]
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    else:
        times = [one_step() for _ in range(args.steps)]
    median = statistics.median(times)
    print(
        f"{args.dtype}{' compiled' if args.compile else ''} {runner.backend.name} "
        f"threads={args.threads} batch={args.batch} "
        f"context={low}..{high} "
        f"(mean {statistics.mean(contexts):.0f}) prefill={args.prefill}: "
        f"{median * 1000:.1f} ms/step (min {min(times) * 1000:.1f}), "
        f"{args.batch / median:.0f} decode tokens/s; set-up prefills {set_up_seconds:.1f} s, "
        f"2 warm-up steps {warm_up:.1f} s"
    )


if __name__ == "__main__":
    main()
