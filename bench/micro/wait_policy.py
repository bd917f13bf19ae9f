"""The worker's OpenMP wait policy, measured: decode-step time under each policy, alone
and beside a busy process that competes for the cores.

    .venv/bin/python -m bench.micro.wait_policy [--policies default,GOMP_SPINCOUNT=10000,...]
        [--dtypes q4_1,float32] [--batches 1,16] [--threads 2] [--steps 20] [--repeats 3]

libgomp reads its policy once, when it loads (with torch), so each policy runs in a
child process started with that environment (it loads the model once); "default"
clears both variables, as a worker started without them has them. A busy competitor
is a plain spinning Python process (another worker, a build, a benchmark client): each
child times its steps alone, then with one started beside it. The children
run policy by policy in turn, `--repeats` times over, so
that a machine whose load drifts weighs on every policy alike; the report is the
median of each child's median step time. The worker's default (worker_svc/wait_policy.py)
and the README's paragraph come from this.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

POLICY_VARIABLES = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
POLICIES = ("default", "GOMP_SPINCOUNT=10000", "OMP_WAIT_POLICY=PASSIVE")


def child(args) -> None:
    """Loads each runner once and times its steps alone, then beside a busy process."""
    import torch

    from bench.micro.measure_dtype import make_runner
    from bench.micro.step_profile import set_up, step_plan

    torch.set_num_threads(args.threads)
    result = {}
    for dtype in args.dtypes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            runner = make_runner(dtype, batch * (-(-(args.context + args.steps + 70) // 16)) + 2)
            free = set_up(runner, [args.context] * batch, seed=0)
            for busy in (b == "1" for b in args.busy.split(",")):
                competitor = _competitor() if busy else None
                try:
                    samples = []
                    for step in range(args.steps + 2):
                        started = time.perf_counter()
                        runner.execute(step_plan(batch, [], free, runner.pool.block_size))
                        if step >= 2:  # two warm-up steps
                            samples.append(time.perf_counter() - started)
                finally:
                    if competitor is not None:
                        competitor.kill()
                        competitor.wait()
                key = f"{dtype} batch {batch} {'busy' if busy else 'idle'}"
                result[key] = statistics.median(samples) * 1e3
    print(json.dumps(result))


def _competitor() -> subprocess.Popen:
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    time.sleep(0.2)  # running before the first timed step
    return busy


def _environment(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARIABLES}
    if policy != "default":
        for setting in policy.split("+"):
            name, _, value = setting.partition("=")
            env[name] = value
    return env


def run_child(policy: str, args) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench.micro.wait_policy", "--child", *_passed(args)]
    env = _environment(policy)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _passed(args) -> list[str]:
    return [
        f"--dtypes={args.dtypes}",
        f"--batches={args.batches}",
        f"--threads={args.threads}",
        f"--steps={args.steps}",
        f"--context={args.context}",
        f"--busy={args.busy}",
    ]


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.wait_policy") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--dtypes", default="q4_1")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", default="0,1", help="runs alone (0) and beside a busy process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    from worker_svc.compute.cpu_features import cpu_name

    print(f"CPU: {cpu_name()}, {args.threads} threads, load {os.getloadavg()[0]:.1f}")
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for policy in args.policies.split(","):
            for name, ms in run_child(policy, args).items():
                samples.setdefault((name, policy), []).append(ms)
    for (name, policy), values in sorted(samples.items()):
        print(
            f"{name:23s} {policy:28s} "
            f"{statistics.median(values):8.1f} ms/step median of {len(values)} "
            f"({', '.join(f'{v:.1f}' for v in values)})"
        )
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
