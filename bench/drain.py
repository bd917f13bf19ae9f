"""`cbserve bench drain`: what draining a busy worker costs its streams (issue 46: 16
running requests drained with 0 recomputed tokens, every stream token-identical, each
paused for less than one recompute of its prompt).

One local stack of two workers (`--threads 1` each). Run 1: N streams (prompts of
--prompt-tokens of their own token ids, greedy, --max-tokens each) without a drain: the
reference tokens and each stream's median gap between responses. Run 2: the same
requests; once every stream has --drain-after tokens, AdminService.DrainWorker on the
worker running the most of them. Then --probes prompts of the same length, each sent
alone to the worker left (nothing cached for them): one recompute's time, their TTFT.

Per stream: the longest gap between two of its responses that spans the drain (from
the call to its answer), against its median gap in run 1 and against the recompute
time; for a stream that moved, where its pause went, from the scheduler's log: the
wait for its plans in flight (park), the transfer (send), and adoption to its next
token (first step). Also: the scheduler's recomputed count (must stay 0), tokens moved,
and whether every stream is token-identical to run 1. Printed as a table; --out
writes it all as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path

from bench.drain_drive import DrainCall, Stream, recompute_seconds, run_streams
from cbserve.local_stack import LocalStack

MOVED_EVENT = "request moved with its KV"


def moves_from_log(path: Path) -> dict[str, dict]:
    """Each moved request's log line (request_id -> its fields)."""
    moves = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == MOVED_EVENT:
            moves[record["request_id"]] = record
    return moves


def drain_gap(stream: Stream, drain: DrainCall) -> float:
    """The stream's longest gap between responses that overlaps the drain call."""
    spans = [b - a for a, b in stream.gaps() if b >= drain.started and a <= drain.ended]
    return max(spans, default=0.0)


def longest_decode_gap(streams: list[Stream]) -> float:
    """The longest gap between responses once every stream has its first token (the
    gaps before are other prompts' prefills)."""
    decoding = max(stream.arrivals[0] for stream in streams)
    return max(b - a for stream in streams for a, b in stream.gaps() if a >= decoding)


def stream_rows(
    reference: list[Stream], drained: list[Stream], drain: DrainCall, moves: dict, recompute: float
) -> list[dict]:
    rows = []
    for before, after in zip(reference, drained, strict=True):
        median = statistics.median([b - a for a, b in before.gaps()])
        pause = drain_gap(after, drain)
        row = {
            "stream": after.request_id,
            "tokens": len(after.token_ids),
            "identical": after.token_ids == before.token_ids,
            "moved": after.request_id in moves,
            "median_gap_ms": median * 1e3,
            "drain_gap_ms": pause * 1e3,
            "gap_over_median": pause / median,
            "gap_over_recompute": pause / recompute,
        }
        move = moves.get(after.request_id)
        if move is not None:
            adopted = move["adopted_at"]
            next_token = min((t for t in after.arrivals if t >= adopted), default=None)
            row["park_wait_ms"] = move["park_wait_s"] * 1e3
            row["send_ms"] = move["seconds"] * 1e3
            row["first_step_ms"] = (next_token - adopted) * 1e3 if next_token else None
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    columns = [
        ("stream", "{}"),
        ("moved", "{}"),
        ("identical", "{}"),
        ("median_gap_ms", "{:.0f}"),
        ("drain_gap_ms", "{:.0f}"),
        ("gap_over_median", "{:.1f}"),
        ("gap_over_recompute", "{:.2f}"),
        ("park_wait_ms", "{:.0f}"),
        ("send_ms", "{:.0f}"),
        ("first_step_ms", "{:.0f}"),
    ]
    cells = [[name for name, _ in columns]]
    for row in rows:
        cells.append(
            [form.format(row[name]) if row.get(name) is not None else "-" for name, form in columns]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def measure(args: argparse.Namespace, log_path: Path) -> dict:
    dtype = ["--dtype", args.dtype] if args.dtype else []
    worker_args = ["--threads", str(args.threads), *dtype]
    if args.num_kv_blocks:
        worker_args += ["--num-kv-blocks", str(args.num_kv_blocks)]
    stack = LocalStack(num_workers=2, worker_args=worker_args, scheduler_log=log_path)
    common = (args.streams, args.prompt_tokens, args.max_tokens)
    with stack:
        address, metrics_url = stack.address, stack.metrics_url
        reference, _ = asyncio.run(run_streams(address, metrics_url, "ref", *common, None))
        drained, drain = asyncio.run(
            run_streams(address, metrics_url, "drain", *common, args.drain_after)
        )
        probes = asyncio.run(
            recompute_seconds(address, args.streams, args.prompt_tokens, args.probes)
        )
        metrics = stack.metrics()
    recompute = min(probes)
    rows = stream_rows(reference, drained, drain, moves_from_log(log_path), recompute)
    pauses = [row["drain_gap_ms"] for row in rows]
    reply = drain.reply
    return {
        "prompt_tokens": args.prompt_tokens,
        "streams": args.streams,
        "drained_worker": drain.worker,
        "running_before_drain": drain.running_before,
        "drain_call_s": drain.ended - drain.started,
        "requests_moved": reply.requests_moved,
        "requests_recomputed": reply.requests_recomputed,
        "requests_requeued": reply.requests_requeued,
        "tokens_not_recomputed": reply.tokens_not_recomputed,
        "bytes_moved": reply.bytes_moved,
        "recomputed_total_metric": metrics.get("cbserve_requests_recomputed_total", 0.0),
        "kv_transfer_tokens_total": metrics.get("cbserve_kv_transfer_tokens_total", 0.0),
        "all_identical": all(row["identical"] for row in rows),
        "recompute_s": probes,
        "longest_drain_gap_ms": max(pauses),
        "median_gap_ms": statistics.median(row["median_gap_ms"] for row in rows),
        "longest_gap_without_drain_ms": longest_decode_gap(reference) * 1e3,
        "longest_gap_over_recompute": max(pauses) / 1e3 / recompute,
        "streams_table": rows,
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=64, help="each stream's")
    parser.add_argument("--drain-after", type=int, default=8, help="tokens every stream has")
    parser.add_argument("--probes", type=int, default=2, help="recompute probes (min taken)")
    parser.add_argument("--threads", type=int, default=1, help="each worker's threads")
    parser.add_argument("--dtype", default="float32", help="the workers' --dtype")
    parser.add_argument("--num-kv-blocks", type=int, default=0, help="0: the workers' own")
    parser.add_argument("--out", type=Path, default=Path("out/drain/results.json"))
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        result = measure(args, Path(directory) / "scheduler.log")
    print_table(result["streams_table"])
    for name, value in result.items():
        if name != "streams_table":
            print(f"{name}: {value:.3f}" if isinstance(value, float) else f"{name}: {value}")
    met = (
        result["recomputed_total_metric"] == 0
        and result["requests_recomputed"] == 0
        and result["all_identical"]
        and result["longest_gap_over_recompute"] < 1.0
    )
    print(f"target (0 recomputed, identical, every pause < one recompute): {met}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    main()
