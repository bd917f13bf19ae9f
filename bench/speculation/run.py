"""`cbserve bench speculation`: tok/s with n-gram speculation off and on, side by side,
with the acceptance read from the server's own counters (issue 32, item 6).

    cbserve bench speculation                                    # edit, summarize, chat at 1 and 64
    cbserve bench speculation --workload edit --concurrency 1,64 --repeats 2
    cbserve bench speculation --workload edit --concurrency 1 --num-prompts 2 --servers cbserve

For each workload (bench/harness/spec_workloads.py) and number of streams, every
server is measured with speculation off and on, alternated (off then on, then on then
off on the next repeat), each run on a fresh server on this machine: cbserve's local
stack (the default compute path; `--speculative-config` for `on`), and llama.cpp's
llama-server on the shipped GGUF without and with its own n-gram speculation where its
build has it. Prints a markdown table for bench/RESULTS.md, with the CPU named, and
writes it with results.json into --out-dir.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from bench.flag_main import flag_main
from bench.speculation.config import SpeculationBenchConfig
from bench.speculation.report import OFF, ON, Run, markdown, rows

LLAMACPP = "llamacpp"


def _order(repeat: int) -> tuple[str, str]:
    """Off first on even repeats, on first on odd ones: neither always runs on a
    machine that the other has just warmed (or that a neighbour has just loaded)."""
    return (OFF, ON) if repeat % 2 == 0 else (ON, OFF)


def _llamacpp_problem() -> str | None:
    from bench.peers import llamacpp

    return llamacpp.missing()


def measure(config: SpeculationBenchConfig, notes: list[str]) -> list[Run]:
    from bench.harness.runner import ClientSettings
    from bench.harness.spec_workloads import make_requests
    from bench.serving.options import worker_threads
    from bench.speculation.servers import cbserve_run, llamacpp_run
    from common.defaults import converted_model_dir

    servers = list(config.servers)
    if LLAMACPP in servers:
        problem = _llamacpp_problem()
        if problem:
            notes.append(f"llama.cpp not measured: {problem}")
            servers.remove(LLAMACPP)
    threads = worker_threads(
        argparse.Namespace(worker_args=config.worker_args, threads=config.threads)
    )
    log_dir = config.out_dir / "logs"
    runs: list[Run] = []
    for workload in config.workload:
        for concurrency in config.concurrency:
            requests = make_requests(
                workload,
                config.prompts_for(concurrency),
                config.seed,
                converted_model_dir(),
                config.max_output_tokens,
            )
            settings = ClientSettings(
                max_concurrency=concurrency,
                seed=config.seed,
                temperature=0.0,
                ignore_eos=config.ignore_eos,
            )
            for repeat in range(config.repeats):
                for server in servers:
                    for speculation in _order(repeat):
                        if server == LLAMACPP:
                            try:
                                run = llamacpp_run(
                                    workload, requests, settings, speculation, threads,
                                    config.llamacpp_spec_argv(), log_dir,
                                )  # fmt: skip
                            except (RuntimeError, TimeoutError, OSError) as error:
                                # A baseline failing must not lose cbserve's figures.
                                notes.append(f"llama.cpp {workload} x{concurrency}: {error}")
                                continue
                        else:
                            run = cbserve_run(
                                workload, requests, settings, speculation, config.worker_argv(),
                                config.scheduler_argv(speculation == ON), log_dir,
                            )  # fmt: skip
                        print(_progress_line(run), file=sys.stderr, flush=True)
                        runs.append(run)
    return runs


def _progress_line(run: Run) -> str:
    accepted = run.acceptance.mean_acceptance_length
    return (
        f"{run.system} {run.workload} x{run.concurrency} speculation {run.speculation}: "
        f"{run.output_tokens} tokens in {run.wall_s:.1f} s = {run.tokens_per_s:.1f} tok/s"
        + (f", mean acceptance length {accepted:.2f}" if run.speculation == ON else "")
        + (f", {run.failed} failed" if run.failed else "")
    )


def heading(config: SpeculationBenchConfig, command: str) -> list[str]:
    from bench.harness.source_texts import python_version
    from bench.scheduler.run import cpu_model

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    llama = LLAMACPP in config.servers
    return [
        f"Speculation off and on, alternated, {when}; CPU: {cpu_model()}.",
        f"`{command}`",
        f"cbserve `--speculative-config '{config.speculative_config}'`"
        + (f"; llama-server `{' '.join(config.llamacpp_spec_argv())}`" if llama else "")
        + "; greedy, ignore_eos "
        f"{'on' if config.ignore_eos else 'off'}, max_tokens capped at {config.max_output_tokens}; "
        f"texts from Python {python_version()}'s standard library (edit, summarize) and "
        "ShareGPT (chat).",
    ]


def row_notes(grouped) -> list[str]:
    notes = []
    for row in grouped:
        if not row.same_tokens:
            notes.append(
                f"{row.system} {row.workload} x{row.concurrency}: the runs produced different "
                "token counts (greedy replies with speculation on and off differ somewhere)"
            )
        failed = sum(r.failed for r in row.off + row.on)
        if failed:
            notes.append(
                f"{row.system} {row.workload} x{row.concurrency}: {failed} requests failed"
            )
    return notes


def write(config: SpeculationBenchConfig, runs: list[Run], notes: list[str], command: str) -> str:
    """results.md and results.json in --out-dir from the recorded runs; the markdown."""
    grouped = rows(runs)
    notes = notes + row_notes(grouped)
    notes.append(
        "tok/s: output tokens over the run's wall time (first send to last token), the "
        "mean over repeats; mean acceptance length = 1 + accepted / drafts, acceptance "
        "rate = accepted / draft tokens, from each server's spec_decode counters."
    )
    if any(r.system == "llama.cpp" for r in runs):
        notes.append(
            "llama.cpp: llama-server on the shipped Q4_1 GGUF (cbserve: its default "
            "--dtype), so compare its on/off ratio rather than its tok/s."
        )
    text = markdown(grouped, heading(config, command), notes)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    (config.out_dir / "results.md").write_text(text)
    record = {
        "command": command,
        "config": {k: str(v) if k == "out_dir" else v for k, v in asdict(config).items()},
        "runs": [
            {**asdict(r), "tokens_per_s": r.tokens_per_s, "acceptance": r.acceptance.as_dict()}
            for r in runs
        ],  # fmt: skip
    }
    (config.out_dir / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    return text


def run(config: SpeculationBenchConfig, command: str) -> int:
    notes: list[str] = []
    runs = measure(config, notes)
    print(write(config, runs, notes, command))
    print(
        f"wrote {config.out_dir / 'results.md'}, {config.out_dir / 'results.json'}", file=sys.stderr
    )
    return 1 if any(r.failed for r in runs) else 0


def main(argv: list[str] | None = None, prog: str = "python -m bench.speculation.run") -> int:
    return flag_main(SpeculationBenchConfig, run, argv, prog, __doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
