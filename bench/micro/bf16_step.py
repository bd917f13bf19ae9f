"""A bfloat16-weights decode step, the native step against the Python forward on torch's
bfloat16 GEMM, in one process on one set of sequences, steps taken in turn.

    .venv/bin/python -m bench.micro.bf16_step --model BF16_DIR [--batches 1,16,32,64]
        [--steps 7] [--threads 1] [--context 200] [--python]

BF16_DIR is a bfloat16 checkpoint (tests/worker/architectures/test_bfloat16_weights.py's
bfloat16_copy makes one of any float directory). For each batch, `batch` sequences of
`context` tokens decode one token a step; the steps alternate between
- "native": the native decode step (models/qblock/native.py), every BF16 projection on
  the float block kernel;
- "gemm": the Python forward with every BF16 projection on bf16_matmul
  (compute/qblock_linear.py), the native step declining;
- with --python, "python": the Python forward on the block kernel (no native step, no
  GEMM), for reference.
Each figure is the median ms of --steps steps; alternating steps puts both ways under
the same load of a shared machine. Set bf16_gemm_from_m (compute/measured.py) at the
batch from which "gemm" leads. Run it under the worker's OpenMP wait policy
(`GOMP_SPINCOUNT=10000`, worker_svc/wait_policy.py) on more than one thread: with
libgomp's default spin, the Python forward's hundreds of parallel regions a step made it
10-40x slower beside other busy processes, the single-region native step 2-3x.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.micro.measure_dtype import make_runner
from bench.micro.step_profile import set_up, step_plan
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.compute.qblock_linear import QBlockLinear


def set_way(model, native, way: str) -> None:
    """Points every BF16 projection and the native step at one way of computing."""
    gemm = way == "gemm"
    for module in model.modules():
        if isinstance(module, QBlockLinear) and module.format.name == "BF16":
            module.bf16_gemm_from_m = 1 if gemm else None
    native.bf16_gemm_from_m = 0  # the native way never declines for the GEMM
    model.native_decode = native if way == "native" else None


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.bf16_step") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a bfloat16 checkpoint directory")
    parser.add_argument("--batches", default="1,16,32,64")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--python", action="store_true", help="also the Python forward alone")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ways = ["native", "gemm"] + (["python"] if args.python else [])
    print(f"CPU: {cpu_name()}, {args.threads} threads, context {args.context}; median ms/step")
    print(f"{'batch':>5s}  " + "  ".join(f"{w:>8s}" for w in ways) + "  gemm/native")
    for batch in (int(b) for b in args.batches.split(",")):
        room = len(ways) * (args.steps + 1) + 4
        blocks = batch * -(-(args.context + room) // 16) + 2
        runner = make_runner("bfloat16-weights", blocks, model=args.model)
        model = runner.loaded.model
        native = model.native_decode
        if native is None:
            raise SystemExit(f"no native step: {model.native_decode_status}")
        free = set_up(runner, [args.context] * batch, seed=0, decode_room=room)
        plan = step_plan(batch, [], free, runner.pool.block_size)
        times = {way: [] for way in ways}
        for step in range(args.steps + 1):  # the first round warms each way up
            for way in ways:
                set_way(model, native, way)
                started = time.perf_counter()
                runner.execute(plan)
                if step:
                    times[way].append(time.perf_counter() - started)
        medians = [statistics.median(times[way]) * 1e3 for way in ways]
        print(
            f"{batch:5d}  "
            + "  ".join(f"{ms:8.1f}" for ms in medians)
            + f"  {medians[1] / medians[0]:10.2f}",
            flush=True,
        )
        del runner, model, native


if __name__ == "__main__":
    main()
