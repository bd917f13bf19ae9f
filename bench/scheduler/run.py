"""`cbserve bench scheduler` (`make bench-scheduler`): how many tokens a second one
scheduler can stream, and at what CPU cost, with workers that cost nothing.

    cbserve bench scheduler                                # issue 21's loads
    cbserve bench scheduler --loads 2x10:64 1x0:512 --fronts grpc
    python -m bench.scheduler.run --loads 1x0:8 --requests-per-stream 1 --output-len 16

For each set of workers (count and step time) it starts a local stack of real
processes: N `python -m worker_svc --model-impl null` workers and one
`python -m scheduler_svc` (with --scheduler-args). At each load it runs the load
generator (bench/scheduler/load.py, its own process) over each front, reading the
workers' /metrics before and after, then does the same at each number of streams
against the bare streaming server (bench/scheduler_bench's floor). The table
(bench/scheduler/report.py) goes to stdout and, with results.json and the plots,
into --out-dir.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import urllib.request
from dataclasses import asdict
from itertools import groupby
from pathlib import Path

from bench.flag_main import flag_main
from bench.scheduler.config import SchedulerBenchConfig
from bench.scheduler.report import (
    BARE,
    SCHEDULER,
    Load,
    Measurement,
    capacity_table,
    floor_table,
    process_table,
    structured_table,
)
from common.defaults import DEFAULT_BLOCK_SIZE, REPO_ROOT

FORWARD_SECONDS = "cbserve_worker_forward_seconds"
LOAD_TIMEOUT_S = 900.0


def cpu_model(cpuinfo: str | None = None) -> str:
    """This machine's CPU as /proc/cpuinfo names it (a VM's name may be only the
    vendor's, so with its family and model numbers), with its logical CPU count."""
    text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    fields: dict[str, str] = {}
    count = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        count += key == "processor"
        fields.setdefault(key, value.strip())
    name = fields.get("model name", "unknown CPU")
    vector = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
              if f in fields.get("flags", "").split()]  # fmt: skip
    return (
        f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, "
        f"{count or os.cpu_count()} CPUs{', ' + ' '.join(vector) if vector else ''})"
    )


@contextlib.contextmanager
def children_log_to(path: Path):
    """Children started inside inherit this process's stderr: the stack's logs (a line
    per finished request from the scheduler) go to a file instead of over the table."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def worker_counters(url: str) -> tuple[float, int]:
    """A worker's seconds in its runner and steps so far, from its /metrics."""
    from common.metrics import parse_samples

    with urllib.request.urlopen(url, timeout=10.0) as response:
        samples = parse_samples(response.read().decode())
    busy = sum(v for k, v in samples.items() if k.startswith(FORWARD_SECONDS + "_sum"))
    steps = sum(v for k, v in samples.items() if k.startswith(FORWARD_SECONDS + "_count"))
    return busy, int(steps)


def run_load(config: SchedulerBenchConfig, front: str, address: str, streams: int,
             watch: dict[str, int], seed: int, constrained: int = 0,
             constraint: str = "json") -> dict:  # fmt: skip
    """One run of the load generator; its LoadResult as a dict."""
    argv = [sys.executable, "-m", "bench.scheduler.load", "--front", front]
    argv += ["--address", address, "--streams", str(streams)]
    argv += ["--constrained-streams", str(constrained), "--constraint", constraint]
    argv += ["--requests-per-stream", str(config.requests_per_stream)]
    argv += ["--prompt-len", str(config.prompt_len), "--output-len", str(config.output_len)]
    argv += ["--seed", str(seed)]
    for label, pid in watch.items():
        argv += ["--watch", f"{label}={pid}"]
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=LOAD_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": path}, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the load generator failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measurement(load: Load, front: str, raw: dict, busy_s: float = 0.0, steps: int = 0):
    return Measurement(
        load=load, front=front, wall_s=raw["wall_s"], requests=raw["requests"],
        completed=raw["completed"], tokens=raw["tokens"], messages=raw["messages"],
        client_cpu_s=raw["client_cpu_s"], cpu_s=raw["cpu_s"], worker_busy_s=busy_s,
        worker_steps=steps, machine_cpu_s=raw.get("machine_cpu_s", 0.0),
        errors=tuple(raw["errors"]), constrained_tokens=raw.get("constrained_tokens", 0),
        constrained_stream_s=raw.get("constrained_stream_s", 0.0),
        free_stream_s=raw.get("free_stream_s", 0.0),
    )  # fmt: skip


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_stack(config: SchedulerBenchConfig, loads: list[Load]) -> list[Measurement]:
    """Every load of one worker set-up (same count and step time) on one stack."""
    from cbserve.local_stack import LocalStack

    first = loads[0]
    tokens = config.prompt_len + config.output_len
    blocks = max(load.streams for load in loads) * -(-tokens // DEFAULT_BLOCK_SIZE) + 64
    stack = LocalStack(
        num_workers=first.workers,
        http_port=0 if "http" in config.fronts else None,
        # Each worker's /metrics (its busy time) on a free port: a worker's is off by default.
        worker_metrics_ports=[0] * first.workers,
        worker_args=config.worker_argv(first, blocks),
        scheduler_args=config.scheduler_argv(),
    )
    _say(f"starting {first.workers} null worker(s) and a scheduler ...")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    with children_log_to(config.out_dir / "stack.log"):
        stack.start()
    rows = []
    try:
        urls = [stack.worker_metrics_url(index) for index in range(len(stack.workers))]
        watch = {SCHEDULER: stack.scheduler.process.pid}
        watch |= {f"worker{i}": w.process.pid for i, w in enumerate(stack.workers)}
        # For a profiler to attach to (py-spy record --pid PID, see the README).
        _say("  pids: " + " ".join(f"{label}={pid}" for label, pid in watch.items()))
        for load in loads:
            for front in config.fronts:
                address = stack.address if front == "grpc" else stack.http_url.split("//")[1]
                _say(f"  {load.label} over {front} ...")
                before = [worker_counters(url) for url in urls]
                raw = run_load(config, front, address, load.streams, watch, seed=len(rows),
                               constrained=load.constrained_streams,
                               constraint=load.constraint)  # fmt: skip
                after = [worker_counters(url) for url in urls]
                busy = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
                steps = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
                rows.append(_measurement(load, front, raw, busy, steps))
                if stack.first_exit() is not None:
                    raise RuntimeError(f"{stack.first_exit().name} exited during the run")
    finally:
        stack.stop()
    return rows


def measure_floor(config: SchedulerBenchConfig, streams: list[int]) -> list[Measurement]:
    """The bare streaming server at each number of streams."""
    from cbserve.local_stack import ChildProcess

    argv = [sys.executable, "-m", "bench.scheduler.bare_stream_server", "--port", "0"]
    server = ChildProcess(BARE, argv)
    rows = []
    try:
        address = server.wait_ready().split(" on ", 1)[1].strip()
        for count in streams:
            _say(f"  bare streaming server, {count} streams ...")
            raw = run_load(config, "grpc", address, count, {BARE: server.process.pid}, seed=0)
            rows.append(_measurement(Load(1, 0.0, count), BARE, raw))
    finally:
        server.stop()
    return rows


def run(config: SchedulerBenchConfig, command: str) -> int:
    loads = config.parsed_loads
    rows: list[Measurement] = []
    setups = groupby(loads, key=lambda load: (load.workers, load.step_ms, load.us_per_token))
    for _, group in setups:
        rows += measure_stack(config, list(group))
    if config.floor:
        rows += measure_floor(config, sorted({load.streams for load in loads}))
    write_results(config, rows, command)
    return 0 if all(row.failed == 0 for row in rows) else 1


def write_results(config: SchedulerBenchConfig, rows: list[Measurement], command: str) -> None:
    config.out_dir.mkdir(parents=True, exist_ok=True)
    text = "\n\n".join(
        [f"`{command}` on {cpu_model()}", capacity_table(rows)]
        + ([structured_table(rows)] if any(row.load.constrained_streams for row in rows) else [])
        + ([floor_table(rows)] if any(row.front == BARE for row in rows) else [])
        + [process_table(rows)]
    )
    print(text)
    (config.out_dir / "results.md").write_text(text + "\n")
    data = [{**asdict(row), "derived": _derived(row)} for row in rows]
    (config.out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    for row in rows:
        for error in row.errors:
            _say(f"{row.load.label} over {row.front}: {error}")
    if config.plots:
        from bench.scheduler.plots import write_plots

        for path in write_plots(rows, config.out_dir):
            _say(f"wrote {path}")


def _derived(row: Measurement) -> dict:
    values = {
        "tok_s": row.tok_s, "capacity_tok_s": row.load.capacity_tok_s, "share": row.share,
        "busy": row.busy, "outside_ms_per_step": row.outside_ms_per_step,
        "scheduler_cpu_ms_per_step": row.scheduler_cpu_ms_per_step,
        "server_cpu_s_per_1k": row.server_cpu_per_1k, "client_cpu_s_per_1k": row.client_cpu_per_1k,
        "other_cores": row.other_cores,
    }  # fmt: skip
    # JSON has no inf or nan.
    return {k: (v if math.isfinite(v) else None) for k, v in values.items()}


def main(argv: list[str] | None = None, prog: str = "python -m bench.scheduler.run") -> int:
    return flag_main(SchedulerBenchConfig, run, argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
