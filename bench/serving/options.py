"""The flags of `cbserve bench` (also `python -m bench`), named as in `vllm bench serve`.

BenchConfig (bench/serving/config.py) declares the benchmark's own; the flags a local stack
is started with are the worker's and the scheduler's, declared on their configs.
Free of heavy imports, so that building the `cbserve` command line stays quick for
its other subcommands.
"""

from __future__ import annotations

import argparse
import shlex

from bench.harness.lora_assignment import LoraModules
from bench.serving.config import DTYPES, TARGET, BenchConfig
from common.cli_config import FlagError, add_flags, build, to_argv
from common.flag_fields import BENCH, forwarded_flags
from scheduler_svc.config import SchedulerConfig
from worker_svc.config import DEFAULT_DTYPE, WorkerConfig

# The stack's own flags that the benchmark passes on: those marked forwarded_by BENCH on
# the processes' configs (its --threads and --model mean more: llama-server's threads,
# the workload's tokenizer; they are BenchConfig's).
STACK_WORKER_FLAGS = forwarded_flags(WorkerConfig, BENCH)
STACK_SCHEDULER_FLAGS = forwarded_flags(SchedulerConfig, BENCH)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, BenchConfig)
    add_flags(parser, WorkerConfig, only=STACK_WORKER_FLAGS, forward_to="worker", group=TARGET)
    add_flags(
        parser, SchedulerConfig, only=STACK_SCHEDULER_FLAGS, forward_to="scheduler", group=TARGET
    )


def recorded_command(argv: list[str]) -> str:
    """The command line as results.json and results.md record it, without the API key."""
    shown = list(argv)
    for index, arg in enumerate(shown):
        if arg.startswith("--api-key="):
            shown[index] = "--api-key=REDACTED"
        elif arg == "--api-key" and index + 1 < len(shown):
            shown[index + 1] = "REDACTED"
    return shlex.join(shown)


def check(args: argparse.Namespace) -> str | None:
    """Checks the parsed flags (BenchConfig's __post_init__ and the stack's configs);
    returns an error message or None. Puts on args the forms the benchmark reads: the
    request rates flattened, the length ranges and --goodput parsed, the dtypes settled."""
    try:
        config = build(BenchConfig, args)
        build(WorkerConfig, args, only=STACK_WORKER_FLAGS, model="checked by the worker")
        build(SchedulerConfig, args, only=STACK_SCHEDULER_FLAGS)
    except FlagError as error:
        return str(error)
    args.dtype = args.dtype or DEFAULT_DTYPE
    args.hf_dtype = config.hf_dtype or (args.dtype if args.dtype in DTYPES else "float32")
    args.request_rate = config.rates
    args.baselines = list(dict.fromkeys(config.baselines))
    args.random_input_len, args.random_output_len = config.input_len, config.output_len
    args.goodput = config.slos
    return None


def worker_threads(args: argparse.Namespace) -> int:
    """The worker's compute threads: --threads in --worker-args, else --threads, else
    what the worker takes by default (torch's intra-op thread count on this machine).
    llama-server gets the same number, so that both use the same cores."""
    given = shlex.split(args.worker_args)
    for index, flag in enumerate(given):
        if flag == "--threads" and index + 1 < len(given):
            return int(given[index + 1])
        if flag.startswith("--threads="):
            return int(flag.split("=", 1)[1])
    if args.threads is not None:
        return args.threads
    import torch

    return torch.get_num_threads()


def stack_args(args: argparse.Namespace, batching: str | None) -> tuple[list[str], list[str]]:
    """Worker and scheduler flags of a local stack; batching None leaves the default."""
    worker = to_argv(args, WorkerConfig, STACK_WORKER_FLAGS)
    if args.threads is not None:
        worker += ["--threads", str(args.threads)]
    if args.model:
        worker += ["--model", str(args.model)]
    scheduler = ["--tokenizer", str(args.model)] if args.model else []
    scheduler += to_argv(args, SchedulerConfig, STACK_SCHEDULER_FLAGS)
    if batching:
        scheduler += ["--batching", batching]
    lora_worker, lora_scheduler = LoraModules.parse(args.lora_modules).stack_args()
    worker += lora_worker
    scheduler += lora_scheduler
    return worker + shlex.split(args.worker_args), scheduler + shlex.split(args.scheduler_args)
