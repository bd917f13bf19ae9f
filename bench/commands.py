"""The subcommands of `cbserve bench` and `python -m bench`: one table for both doors.

A first word that names a row runs that row's `main`, whose flags are its own; any
other command line is the serving benchmark's (bench.serving.serve). Every benchmark
under bench/ is a row here (docs/benchmarks.md says what each prints and where it
writes), so none is run by nothing. Free of heavy imports, so that building the
`cbserve` command line stays quick.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str  # defines main(argv, prog), or main(argv) / main() reading sys.argv
    help: str


SUBCOMMANDS = {
    "scheduler": Subcommand(
        "bench.scheduler.run", "the scheduler's capacity and CPU cost, with null workers"
    ),
    "speculation": Subcommand(
        "bench.speculation.run",
        "n-gram speculative decoding off and on, side by side (edit, summarize, chat)",
    ),
    "accuracy": Subcommand(
        "bench.accuracy.gate", "the accuracy gate of every compute path against float32"
    ),
    "formats": Subcommand(
        "bench.formats.run", "the GGUF files people download, each beside llama.cpp"
    ),
    "one-stream": Subcommand(
        "bench.formats.one_stream", "one stream beside llama-server on a GGUF, alternated rounds"
    ),
    "replicas": Subcommand(
        "bench.replicas.run", "cbserve replicas behind SGLang's gateway: cached prompt tokens"
    ),
    "make-adapters": Subcommand(
        "bench.lora_adapters", "PEFT LoRA adapters with random A and B on the default model"
    ),
    "lora-load-stall": Subcommand(
        "bench.lora_load_stall", "a LoRA adapter loaded at run time: the running streams' gap"
    ),
    "prefill-split": Subcommand(
        "bench.prefill_split", "long prompts beside 32 streams: prefill workers vs colocated"
    ),
    "drain": Subcommand(
        "bench.drain", "16 streams' pause while their worker is drained, beside one recompute"
    ),
    "front": Subcommand(
        "bench.serving.front_overhead", "the OpenAI HTTP front against gRPC, same workload"
    ),
    "sweep": Subcommand(
        "bench.serving.sweep", "cbserve and llama-server over concurrency x prompt length"
    ),
    "memory-pressure": Subcommand(
        "bench.serving.memory_pressure", "one workload on a full and a smaller KV pool"
    ),
    "kv-events": Subcommand(
        "bench.kv_events_exactness", "KV events against the schedulers' caches, block for block"
    ),
    "kv-events-stack": Subcommand(
        "bench.kv_events_stack", "KV events of a real scheduler process against its metric"
    ),
    "kv-events-overhead": Subcommand(
        "bench.kv_events_overhead", "what publishing KV events costs the step loop"
    ),
    "core-cost": Subcommand(
        "bench.scheduler.core_cost", "the scheduler core's CPU per token, without gRPC"
    ),
    "detokenize-cost": Subcommand(
        "bench.scheduler.detokenize_cost", "incremental detokenizing per token beside tokenizers'"
    ),
    "structured-cost": Subcommand(
        "bench.scheduler.structured_cost", "what structured outputs cost a step: masks, matchers"
    ),
    "speculation-ceiling": Subcommand(
        "bench.speculation.ceiling", "how far prompt lookup can go on recorded replies"
    ),
    "draft-rows": Subcommand("bench.micro.draft_rows", "what a verify row costs the native step"),
    "step-profile": Subcommand(
        "bench.micro.step_profile", "one model step in process: ms a step, --profile for ops"
    ),
    "grpc-round-trip": Subcommand(
        "bench.micro.grpc_round_trip", "a Step stream's round trip alone: its wall and CPU"
    ),
    "step-compare": Subcommand(
        "bench.micro.step_compare", "decode steps of several compute paths, interleaved"
    ),
    "architectures": Subcommand(
        "bench.micro.architectures", "every declared architecture's decode beside Llama's"
    ),
    "kernels": Subcommand(
        "bench.micro.kernels", "a step's projections per compute path (auto's measured rows)"
    ),
    "bf16-crossover": Subcommand(
        "bench.micro.bf16_crossover", "BF16 rows per M: block kernel, dense chunks, bf16 GEMM"
    ),
    "bf16-step": Subcommand(
        "bench.micro.bf16_step", "a bfloat16 checkpoint's whole step: native vs the bf16 GEMM"
    ),
    "qblock": Subcommand("bench.micro.qblock", "the block kernels per M on the shipped GGUF"),
    "qblock-formats": Subcommand(
        "bench.micro.qblock_formats", "every block format's kernels per M, random blocks"
    ),
    "weight-stream": Subcommand(
        "bench.micro.weight_stream", "one-row kernels reading weights from memory (GB/s)"
    ),
    "attention": Subcommand(
        "bench.micro.attention_profile", "one layer's decode attention: torch path and C kernel"
    ),
    "attention-ab": Subcommand(
        "bench.micro.attention_ab", "two builds of the paged-decode kernel, in turn"
    ),
    "wait-policy": Subcommand(
        "bench.micro.wait_policy", "OpenMP wait policies under a decode step (the default's)"
    ),
    "native-policy": Subcommand(
        "bench.micro.native_policy", "the native step's panel schedule and barrier spin"
    ),
    "measure-dtype": Subcommand(
        "bench.micro.measure_dtype", "float32 against bfloat16 for a decode and a prefill step"
    ),
    "roofline": Subcommand(
        "bench.roofline.run", "each instruction's measured peak beside the kernels' rates"
    ),
}


def run(argv: list[str], prog: str) -> int | None:
    """Runs the subcommand that argv starts with, shown as `prog NAME`; None when argv
    names none (the serving benchmark's command line)."""
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    main = importlib.import_module(SUBCOMMANDS[argv[0]].module).main
    shown, rest = f"{prog} {argv[0]}", argv[1:]
    parameters = inspect.signature(main).parameters
    if "prog" in parameters:
        code = main(rest, prog=shown)
    else:
        # A main that names its parser itself, or leaves it to argparse's default
        # (sys.argv[0]); both read their flags from argv.
        saved, sys.argv = sys.argv, [shown, *rest]
        try:
            code = main(rest) if parameters else main()
        finally:
            sys.argv = saved
    return 0 if code is None else int(code)


def listing(prog: str) -> str:
    """The subcommands, as the serving benchmark's --help ends."""
    width = max(map(len, SUBCOMMANDS))
    rows = [f"  {prog} {name:<{width}}  {row.help}" for name, row in SUBCOMMANDS.items()]
    return "subcommands, each with flags of its own (NAME --help):\n" + "\n".join(rows)
