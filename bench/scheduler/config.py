"""What one `cbserve bench scheduler` run measures: its flags, validated once.

Each `flag(...)` field is a flag of `cbserve bench scheduler` (python -m
bench.scheduler.run), with the variable CBSERVE_BENCH_SCHEDULER_<FLAG>.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bench.scheduler.report import Load
from common.flag_fields import flag

# Issue 21's table: GPU-like steps of 10-15 ms at small and large batch, and the
# scheduler alone (workers that cost nothing) at 256 and 512 streams.
DEFAULT_LOADS = ("2x10:16", "2x10:64", "2x15:512", "1x0:256", "1x0:512")
FRONTS = ("grpc", "http")
# The deployment: defaults but room for 512 sequences and their prefills.
DEFAULT_SCHEDULER_ARGS = "--max-num-seqs 512 --max-num-batched-tokens 32768"


@dataclass(frozen=True)
class SchedulerBenchConfig:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_BENCH_SCHEDULER_"

    loads: list[str] = flag(
        default_factory=lambda: list(DEFAULT_LOADS),
        several=True,
        metavar="LOAD",
        default_help=" ".join(DEFAULT_LOADS),
        help="WORKERSxSTEP_MS[+US_PER_TOKEN]:STREAMS[/jsonPERCENT|/regexPERCENT] each: 2x10:64 "
        "is 2 null workers with 10 ms steps and 64 client streams; 1x0:512 workers with no "
        "step time; 1x0:64/json50 the same with half the streams constrained by a JSON schema "
        "(the scheduler's CPU with allowed-token masks: compare with 1x0:64); 1x10:48/regex50 "
        "half by a regex (the tokens a constrained and a free stream get: their own table)",
    )
    fronts: list[str] = flag(
        default_factory=lambda: list(FRONTS),
        choices=FRONTS,
        metavar="LIST",
        help="grpc (Generation.Generate) and/or http (the OpenAI-compatible /v1/completions)",
    )
    requests_per_stream: int = flag(
        2, help="requests each stream sends one after another (all streams stay busy)"
    )
    prompt_len: int = flag(64, help="prompt tokens (random ids, no two prompts alike)")
    output_len: int = flag(256, help="output tokens per request, EOS ignored")
    floor: bool = flag(
        True,
        help="also drive a bare grpc.aio Generation server "
        "(bench/scheduler/bare_stream_server.py) at each number of streams: the transport's "
        "floor (--no-floor: skip it)",
    )
    model: str | None = flag(
        None,
        metavar="PATH",
        default_help="the workers' and scheduler's default",
        help="model whose config and tokenizer the null workers describe (the scheduler's "
        "--tokenizer too)",
    )
    worker_args: str = flag("", help="more flags for every null worker, one string")
    scheduler_args: str = flag(
        DEFAULT_SCHEDULER_ARGS, help="flags of the scheduler (python -m scheduler_svc), one string"
    )
    out_dir: Path = flag(
        Path("out/bench-scheduler"), help="results.json, results.md and the PNG plots go here"
    )
    plots: bool = flag(True, help="write the PNG plots (--no-plots: skip them)")

    def __post_init__(self) -> None:
        if not self.loads:
            raise ValueError("loads must not be empty")
        for load in self.loads:
            Load.parse(load)  # raises ValueError naming the bad one
        if not self.fronts or set(self.fronts) - set(FRONTS):
            raise ValueError(f"fronts must be some of {FRONTS}, got {self.fronts}")
        for name in ("requests_per_stream", "prompt_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("worker_args", "scheduler_args"):
            shlex.split(getattr(self, name))  # an unclosed quote fails here, not mid-run

    @property
    def parsed_loads(self) -> list[Load]:
        return [Load.parse(load) for load in self.loads]

    def worker_argv(self, load: Load, num_kv_blocks: int) -> list[str]:
        argv = ["--model-impl", "null", "--null-step-ms", f"{load.step_ms:g}"]
        argv += ["--null-step-us-per-token", f"{load.us_per_token:g}"]
        # The null pool costs no memory: room for every stream on one worker, so that
        # an uneven placement never preempts.
        argv += ["--num-kv-blocks", str(num_kv_blocks)]
        if self.model:
            argv += ["--model", self.model]
        return argv + shlex.split(self.worker_args)

    def scheduler_argv(self) -> list[str]:
        argv = ["--tokenizer", self.model] if self.model else []
        return argv + shlex.split(self.scheduler_args)
