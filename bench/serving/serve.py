"""`cbserve bench`: the serving benchmark, with its baselines on the same prompts.

    cbserve bench                                     # 200 ShareGPT prompts, all at once
    cbserve bench --baselines static,hf               # + cbserve --batching static, transformers
    cbserve bench --request-rate 1 2 4 --goodput ttft:2000 tpot:100
    cbserve bench --dataset random --num-prompts 3 --server localhost:50051
    cbserve bench --backend openai --base-url http://localhost:8000/v1   # any OpenAI server

Without --server every cbserve system gets a fresh local stack (scheduler + worker,
as `make run` starts them) for each request rate. With --server all rates go to the
one server in turn, so a later rate may find earlier prompts in its prefix cache.
transformers' generate runs in this process after the stacks are gone, so no two
systems ever share the CPU. Prints a markdown table (a column per run, ratio columns after) and
writes results.json, results.md and PNG plots into --out-dir.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import urllib.request

import grpc

from bench.harness import lora_assignment, results
from bench.harness.results import Column, column_label, rate_label
from bench.serving import options


def _url_scrape(url: str):
    def scrape() -> dict[str, float]:
        from common.metrics import parse_samples

        with urllib.request.urlopen(url, timeout=5.0) as response:
            return parse_samples(response.read().decode())

    return scrape


def _start_stack(stack_class, worker: list[str], scheduler: list[str]):
    """A started stack, trying twice: where several stacks start on one machine, a port
    picked as free can be taken before the child binds it."""
    try:
        return stack_class(worker_args=worker, scheduler_args=scheduler).start()
    except RuntimeError as error:
        print(f"the stack did not start ({error}); once more", file=sys.stderr, flush=True)
    return stack_class(worker_args=worker, scheduler_args=scheduler).start()


def _cbserve_columns(args, requests, settings, system: str, batching: str | None) -> list[Column]:
    from bench.harness.runner import run_rates
    from cbserve.local_stack import LocalStack

    rates = args.request_rate
    if args.server:
        scrape = _url_scrape(args.metrics_url) if args.metrics_url else None
        outcomes = asyncio.run(
            run_rates(args.server, requests, rates, settings, system, scrape, api_key=args.api_key)
        )
    else:
        # A fresh stack per rate: the prefix cache (on by default) would otherwise serve
        # the second rate's prompts from the first rate's blocks.
        worker, scheduler = options.stack_args(args, batching)
        outcomes = []
        for rate in rates:
            print(f"starting a local stack for {system} ...", file=sys.stderr, flush=True)
            stack = _start_stack(LocalStack, worker, scheduler)
            try:
                scrape = getattr(stack, "metrics", None)
                outcomes += asyncio.run(
                    run_rates(stack.address, requests, [rate], settings, system, scrape)
                )
            finally:
                stack.stop()
    return [
        Column(
            column_label(system, r.rate, args.request_rate),
            system,
            r.rate,
            r.timings,
            r.wall_s,
            {
                **r.server,
                **({"batching": batching} if batching else {}),
                "server_counters": r.server_counters,
            },
        )
        for r in outcomes
    ]


def _start_failure(system: str, error: Exception) -> str:
    message = f"{system} not measured: {error}"
    if system == "static":
        message += (
            " (the static baseline runs the scheduler with `--batching static`; a scheduler "
            "without that flag exits at start, see its message above)"
        )
    return message


def _measure(args, requests, settings) -> tuple[list[Column], list[str]]:
    columns: list[Column] = []
    errors: list[str] = []
    systems = [("cbserve", None)] if args.backend == "cbserve" else []
    if "static" in args.baselines:
        systems.append(("static", "static"))
    if args.backend == "openai":
        from bench.peers import openai_backend

        scrape = _url_scrape(args.metrics_url) if args.metrics_url else None
        try:
            columns += openai_backend.columns(args, requests, settings, scrape)
        except (RuntimeError, OSError) as error:
            errors.append(f"{args.base_url} not measured: {error}")
    if args.lora_beside_base:
        systems.append(("base", None))
    for system, batching in systems:
        # The base column sends the same requests naming no adapter, to the same stack.
        sent = lora_assignment.on_base(requests) if system == "base" else requests
        try:
            columns += _cbserve_columns(args, sent, settings, system, batching)
        except (RuntimeError, TimeoutError, OSError, grpc.RpcError) as error:
            errors.append(_start_failure(system, error))
    if "hf" in args.baselines:
        from bench.peers import hf

        label = f"transformers {args.hf_dtype}"
        try:
            timings, wall, info = hf.run(
                args.model_dir, args.hf_dtype, requests, args.hf_batch_size, settings.progress
            )
            columns.append(Column(label, "hf", math.inf, timings, wall, info))
        except Exception as error:  # a baseline failing must not lose the other results
            errors.append(f"{label} not measured: {type(error).__name__}: {error}")
    if "llamacpp" in args.baselines:
        columns += _llamacpp_columns(args, requests, settings, errors)
    if "vllm" in args.baselines:
        from bench.peers import vllm_peer

        threads = options.worker_threads(args)
        columns += vllm_peer.columns(args, requests, settings, threads, errors)
    return columns, errors


def _missing_peer(args) -> str | None:
    """Why a peer asked for cannot run here (not built, or not for this model), or None."""
    if "llamacpp" in args.baselines:
        from bench.peers import llamacpp

        problem = llamacpp.missing(args.model)
        if problem:
            return problem
    if "vllm" in args.baselines:
        from bench.peers import vllm_peer

        return vllm_peer.missing(args.model)
    return None


def _llamacpp_columns(args, requests, settings, errors: list[str]) -> list[Column]:
    from bench.peers import llamacpp

    system = llamacpp.SYSTEM
    threads = options.worker_threads(args)
    try:
        outcomes = llamacpp.run_rates(
            requests,
            args.request_rate,
            settings,
            threads,
            args.out_dir / "llama-server-logs",
            model=args.model,
        )
    except Exception as error:  # a baseline failing must not lose the other results
        errors.append(f"{system} not measured: {type(error).__name__}: {error}")
        return []
    return [
        Column(
            column_label(system, r.rate, args.request_rate),
            "llamacpp",
            r.rate,
            r.timings,
            r.wall_s,
            r.server,
        )
        for r in outcomes
    ]


def run(args: argparse.Namespace, command: str) -> int:
    from bench.harness.runner import ClientSettings, short_outputs
    from bench.harness.workload import describe, make_workload
    from common.defaults import converted_model_dir

    problem = options.check(args)
    if problem:
        print(f"cbserve bench: {problem}", file=sys.stderr)
        return 2
    problem = _missing_peer(args)
    if problem:  # at once, before minutes of other systems are measured
        print(f"cbserve bench: {problem}", file=sys.stderr)
        return 2
    args.model_dir = args.model or converted_model_dir()
    settings = ClientSettings(
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        seed=args.seed,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        progress=not args.no_progress,
    )
    try:
        requests = make_workload(
            args.dataset,
            args.num_prompts,
            args.seed,
            args.model_dir,
            max_output_tokens=args.max_output_tokens,
            input_len=args.random_input_len,
            output_len=args.random_output_len,
        )
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"cbserve bench: {error}", file=sys.stderr)
        return 2
    adapters = lora_assignment.LoraModules.parse(args.lora_modules).names
    requests = lora_assignment.assign(requests, adapters, args.lora_assignment, args.seed)
    workload = describe(
        requests,
        args.dataset,
        args.seed,
        max_output_tokens=args.max_output_tokens if args.dataset == "sharegpt" else None,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        **lora_assignment.describe(requests, args.lora_assignment),
    )
    print(
        f"workload: {workload['num_prompts']} {args.dataset} requests, "
        f"{workload['total_prompt_tokens']} prompt and up to {workload['total_output_tokens']} "
        f"output tokens; rates: {', '.join(map(rate_label, args.request_rate))}",
        file=sys.stderr,
    )
    roofline = None
    if not args.server and args.backend == "cbserve":
        from bench.serving import roofline as roofline_module

        # Timed before any stack starts, so that nothing else shares the CPU.
        roofline = roofline_module.measure(args.model_dir, args.dtype, options.worker_threads(args))
    columns, errors = _measure(args, requests, settings)
    for column in columns:
        served = ("cbserve", "openai", "static", "llamacpp", "vllm", "base")
        if column.system in served and args.ignore_eos:
            short = short_outputs(requests, column.timings)
            if short:
                print(
                    f"warning: {column.label}: (request, got, asked) {short[:5]}", file=sys.stderr
                )

    table, written = results.write(
        args.out_dir,
        command,
        workload,
        args.request_rate,
        columns,
        args.goodput,
        errors,
        with_plots=not args.no_plots,
    )
    print(table)
    if roofline is not None:
        from bench.harness.metrics import summarize

        served = {c.label: summarize(c.timings, c.wall_s)["output_throughput"] for c in columns}
        line = roofline.line(served)
        print("\n" + line)
        with open(args.out_dir / "results.md", "a") as markdown:
            markdown.write("\n" + line + "\n")
    for message in errors:
        print(f"cbserve bench: {message}", file=sys.stderr)
    print("wrote " + ", ".join(str(path) for path in written), file=sys.stderr)
    return 1 if errors or not columns else 0


def main(argv: list[str] | None = None) -> int:
    from bench.commands import listing

    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.splitlines()[0],
        epilog=listing("python -m bench"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    return run(parser.parse_args(argv), options.recorded_command(["cbserve", "bench", *argv]))


if __name__ == "__main__":
    sys.exit(main())
