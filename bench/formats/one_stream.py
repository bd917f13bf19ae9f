"""One stream, cbserve against llama-server on the same GGUF file, in alternated rounds:

    python -m bench.formats.one_stream --model FILE.gguf [--rounds 9] [--tokens 128]
        [--threads 2] [--worker-args "..."] [--scheduler-args "..."] [--json OUT.json]

Why rounds: one 128-token stream lasts half a second, and a shared VM's speed changes
within seconds (on the 2-core Zen 4 this was written on, the same in-process step read
2.5 and 18.3 ms in two runs a second apart). `cbserve bench --baselines llamacpp` runs
the systems one after the other, so one slow second decides the ratio. Here both servers
are up side by side, idle between requests; each round sends one request to each, the
same random prompt (--prompt-len tokens, EOS ignored, greedy), alternating which goes
first; the ratio is the median of the rounds' ratios, so that a slow second costs one
round, not the figure. Each round's tok/s are printed, so that the spread is seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.formats.run import positive
from bench.harness.runner import ClientSettings
from bench.harness.workload import make_workload

SETTINGS = ClientSettings(progress=False)


@dataclass(frozen=True)
class Round:
    """One round's output tok/s of each system (one request each, the same prompt)."""

    cbserve: float
    llamacpp: float
    cbserve_first: bool

    @property
    def ratio(self) -> float:
        return self.cbserve / self.llamacpp


@dataclass(frozen=True)
class Summary:
    rounds: int
    cbserve_median: float
    llamacpp_median: float
    # The median of the rounds' ratios: the figure.
    median_ratio: float
    # Each system's fastest round against the other's: the two at their calmest.
    best_ratio: float


def summarize(rounds: list[Round]) -> Summary:
    if not rounds:
        raise ValueError("no round completed")
    return Summary(
        rounds=len(rounds),
        cbserve_median=statistics.median(r.cbserve for r in rounds),
        llamacpp_median=statistics.median(r.llamacpp for r in rounds),
        median_ratio=statistics.median(r.ratio for r in rounds),
        best_ratio=max(r.cbserve for r in rounds) / max(r.llamacpp for r in rounds),
    )


def throughput(timing) -> float:
    """Output tok/s of one streamed request, from its send to its last token."""
    if not timing.ok:
        raise RuntimeError(f"a request failed: {timing.error or 'no tokens'}")
    return timing.output_tokens / timing.e2el


async def _rounds(stack_address: str, llama_url: str, requests, log=print) -> list[Round]:
    import aiohttp

    from bench.harness.runner import stream_one as cbserve_one
    from bench.peers.llamacpp import stream_one as llama_one
    from bench.peers.openai_stream import WARM_UP
    from cbserve.client import AsyncClient

    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # as bench.peers.llamacpp
    async with (
        AsyncClient(stack_address) as client,
        aiohttp.ClientSession(connector=connector) as session,
    ):

        async def ours(request) -> float:
            return throughput(await cbserve_one(client, request, SETTINGS))

        async def theirs(request) -> float:
            return throughput(await llama_one(session, llama_url, request, SETTINGS))

        await ours(WARM_UP), await theirs(WARM_UP)
        rounds = []
        for index, request in enumerate(requests):
            first = index % 2 == 0
            if first:
                a = await ours(request)
                b = await theirs(request)
            else:
                b = await theirs(request)
                a = await ours(request)
            rounds.append(Round(a, b, first))
            log(f"round {index + 1}: cbserve {a:.1f} tok/s, llama-server {b:.1f}: {a / b:.2f}x")
        return rounds


def measure(
    model: Path,
    rounds: int,
    tokens: int,
    prompt_len: int,
    threads: int,
    worker_args: list[str],
    scheduler_args: list[str],
):
    """Both servers started on `model`, `rounds` rounds, both stopped; the rounds."""
    from bench.peers import llama_server
    from bench.peers.llamacpp import _started, missing
    from cbserve.local_stack import LocalStack, free_port

    problem = missing(model)
    if problem:
        raise RuntimeError(problem)
    requests = make_workload(
        "random",
        rounds,
        0,
        model,
        input_len=(prompt_len, prompt_len),
        output_len=(tokens, tokens),
    )
    worker = ["--model", str(model), "--threads", str(threads), *worker_args]
    log_dir = Path("out/bench-one-stream")
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(
        worker_args=worker,
        scheduler_args=["--tokenizer", str(model), *scheduler_args],
        scheduler_log=log_dir / "scheduler.log",
    )
    context = llama_server.context_size(1, prompt_len + tokens)
    binary = llama_server.binary_path()
    with stack:
        server = _started(binary, model, 1, threads, context, log_dir, free_port)
        try:
            return asyncio.run(_rounds(stack.address, server.url, requests))
        finally:
            server.stop()


def _parser(prog: str) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    made.add_argument("--model", type=Path, required=True, help="a GGUF file both serve")
    made.add_argument("--rounds", type=positive, default=9)
    made.add_argument("--tokens", type=positive, default=128, help="output tokens a request")
    made.add_argument("--prompt-len", type=positive, default=32)
    made.add_argument("--threads", type=positive, default=2, help="cbserve's and llama.cpp's")
    made.add_argument("--worker-args", default="", help="more cbserve worker flags")
    made.add_argument("--scheduler-args", default="", help="more cbserve scheduler flags")
    made.add_argument("--json", type=Path, help="write the rounds and the summary here")
    return made


def main(argv: list[str] | None = None, prog: str = "python -m bench.formats.one_stream") -> int:
    args = _parser(prog).parse_args(argv)
    rounds = measure(
        args.model,
        args.rounds,
        args.tokens,
        args.prompt_len,
        args.threads,
        shlex.split(args.worker_args),
        shlex.split(args.scheduler_args),
    )
    summary = summarize(rounds)
    print(
        f"one stream, {summary.rounds} alternated rounds of {args.tokens} tokens: cbserve "
        f"{summary.cbserve_median:.1f} tok/s, llama-server {summary.llamacpp_median:.1f} "
        f"(medians); median ratio {summary.median_ratio:.2f}x, fastest rounds "
        f"{summary.best_ratio:.2f}x"
    )
    if args.json:
        record = {"rounds": [asdict(r) for r in rounds], "summary": asdict(summary)}
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
