"""The native decode step's thread pool policy, measured: its panel schedule (static or
dynamic) and its barriers' spin before they sleep, interleaved in one process, under the
OpenMP wait policy this process was started with (it governs the region's start and
end), optionally beside busy processes that compete for the cores.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python -m bench.micro.native_policy [--batches 1,8]
        [--threads 2] [--steps 20] [--context 200] [--busy 0] [--spins 0,2000]
        [--schedules dynamic,static]

`--busy N` starts N processes that spin on the CPU for the whole measurement (another
worker, a build): RESULTS.md saw a step of fbgemm's go from 25 ms to 1,200 ms so. The
schedules run A B A B ..., one decode step of every sequence each (runner.execute), the
runner's Python included; median and min per configuration.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

from bench.micro.measure_dtype import make_runner
from bench.micro.step_profile import set_up, step_plan
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.models.qblock.native import BARRIER_SPIN, SCHEDULES, NativeDecode


def _spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.native_policy") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--spins", default=str(BARRIER_SPIN))
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    spin = os.environ.get("GOMP_SPINCOUNT", "default")
    print(
        f"CPU: {cpu_name()}, {args.threads} threads, OMP_WAIT_POLICY={policy}, "
        f"GOMP_SPINCOUNT={spin}, {args.busy} busy processes, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            measure(batch, args)
    finally:
        for process in busy:
            process.terminate()
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


def measure(batch: int, args) -> None:
    runner = make_runner("q4_1", batch * (-(-(args.context + args.steps + 70) // 16)) + 2)
    model = runner.loaded.model
    if model.native_decode is None:
        raise SystemExit(f"no native decode step: {model.native_decode_status}")
    free = set_up(runner, [args.context] * batch, seed=0)
    steps = {
        f"{schedule} spin {spin}": NativeDecode(model, schedule=schedule, barrier_spin=int(spin))
        for schedule in args.schedules.split(",")
        for spin in args.spins.split(",")
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in range(args.steps + 2):
        for name, native in steps.items():
            model.native_decode = native
            started = time.perf_counter()
            runner.execute(step_plan(batch, [], free, runner.pool.block_size))
            if step >= 2:  # two warm-up steps
                times[name].append(time.perf_counter() - started)
    for name, samples in times.items():
        print(
            f"batch {batch:3d} {name:20s} {statistics.median(samples) * 1e3:7.1f} ms/step "
            f"median (min {min(samples) * 1e3:6.1f})"
        )


if __name__ == "__main__":
    main()
