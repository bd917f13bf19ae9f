"""CPU per message entry of the candidate transports between a core and its API processes.

`python -m bench.transport.measure [--duration 2] [--repeat 3]` runs, for every candidate
(a transport of bench.transport.pipes with a codec of bench.transport.messages), a sending and
a receiving process, each on its own uvloop loop, for each traffic shape:

- `outputs`: core -> api, one StepOutputs of N entries a step, sent back-to-back (the
  transport's ceiling) and paced one every 5 ms (a GPU's step, the usual case);
- `submit`: api -> core, one Submit per request (a prompt of ~1,000 token ids),
  back-to-back.

Each process reads its own CPU time (time.process_time: every thread it has, so
ZeroMQ's I/O thread and grpc's threads count) over the traffic only, and the table
gives it per entry (an output entry, or a submitted request) on either side, with the
receiver's rate and the latency from the send call's start to the decoded object
(CLOCK_MONOTONIC is one clock for every process of the host). With --repeat, each
column keeps its best of the runs: the machine is shared, and noise only adds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop

from bench.transport.messages import CODECS, codec_costs
from bench.transport.pipes import TRANSPORTS

CANDIDATES = ("stream+pickle", "stream+msgspec", "zmq+msgspec", "zmq+pickle", "grpc+msgspec")
WARMUP_MESSAGES = 20
RESULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Traffic:
    name: str
    entries: int  # entries per outputs message; 1 for submits
    pace_s: float  # 0: back-to-back
    prompt_tokens: int = 0  # > 0: submits of this many prompt token ids

    @property
    def label(self) -> str:
        if self.prompt_tokens:
            return f"submit {self.prompt_tokens} ids"
        pace = f"every {self.pace_s * 1e3:g} ms" if self.pace_s else "back-to-back"
        return f"outputs x{self.entries}, {pace}"


def traffic_shapes(pace_s: float, prompt_tokens: int) -> tuple[Traffic, ...]:
    return (
        Traffic("outputs", 64, 0.0),
        Traffic("outputs", 512, 0.0),
        Traffic("outputs", 64, pace_s),
        Traffic("outputs", 512, pace_s),
        Traffic("submit", 1, 0.0, prompt_tokens),
    )


@dataclass(frozen=True)
class Row:
    candidate: str
    traffic: Traffic
    send_us_per_entry: float  # the sending process's CPU, all threads
    send_net_us_per_entry: float  # less the paced loop's own timer wake-ups
    send_calls_us_per_entry: float  # in the send calls only (not ZeroMQ's I/O thread)
    recv_us_per_entry: float
    entries_per_s: float
    latency_p50_us: float  # meaningful when paced: back-to-back, it is queueing
    latency_p99_us: float


def _require_uvloop() -> None:
    """Both ends of the real split run uvloop; zmq.asyncio must work on it (add_reader)."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, uvloop.Loop):
        raise RuntimeError(f"not on uvloop: {type(loop)}")


async def _receive(candidate: str, traffic: Traffic, path: str, ready, done, results) -> None:
    transport, codec_name = candidate.split("+")
    codec = CODECS[codec_name]
    decode = codec.decode_request if traffic.prompt_tokens else codec.decode_outputs
    _require_uvloop()
    receiver = TRANSPORTS[transport][1]()
    await receiver.open(path)
    ready.set()
    for _ in range(WARMUP_MESSAGES):
        decode(await receiver.recv())
    cpu_start, wall_start = time.process_time(), time.monotonic()
    latencies_ns: list[int] = []
    while len(payload := await receiver.recv()):
        message = decode(payload)
        latencies_ns.append(time.monotonic_ns() - codec.sent_at(message))
    cpu_s, wall_s = time.process_time() - cpu_start, time.monotonic() - wall_start
    done.set()
    results.put(("receiver", cpu_s, wall_s, latencies_ns))
    await receiver.close()


async def _paced(send, pace_s: float, duration_s: float) -> tuple[int, float]:
    """Calls send() every pace_s (or back-to-back) for duration_s: (calls, CPU in them)."""
    next_at = time.monotonic()
    end_at, calls, in_calls_s = next_at + duration_s, 0, 0.0
    while (now := time.monotonic()) < end_at:
        if pace_s:
            if next_at > now:
                await asyncio.sleep(next_at - now)
            next_at += pace_s
        call_start = time.process_time()
        await send()
        in_calls_s += time.process_time() - call_start
        calls += 1
    return calls, in_calls_s


async def _nothing() -> None:
    pass


async def _send(candidate: str, traffic: Traffic, path: str, duration_s: float, done, results):
    transport, codec_name = candidate.split("+")
    codec = CODECS[codec_name]
    if traffic.prompt_tokens:
        message = codec.build_submit(0, traffic.prompt_tokens)
    else:
        message = codec.build_outputs(traffic.entries, 1, 0)
    _require_uvloop()
    # What the paced loop costs with nothing to send (its timer wake-ups): the core's
    # loop is awake at every step anyway, so that much is no transport's.
    wake_s = 0.0
    if traffic.pace_s:
        idle_start = time.process_time()
        wakes, _ = await _paced(_nothing, traffic.pace_s, min(duration_s, 1.0))
        wake_s = (time.process_time() - idle_start) / wakes
    sender = TRANSPORTS[transport][0]()
    await sender.open(path)

    async def send_one() -> None:
        await sender.send(codec.encode(codec.stamp(message, time.monotonic_ns())))

    for _ in range(WARMUP_MESSAGES):
        await send_one()
    cpu_start = time.process_time()
    sent, in_calls_s = await _paced(send_one, traffic.pace_s, duration_s)
    await sender.send(b"")
    # Wait for the receiver before reading the clock: ZeroMQ's I/O thread (and grpc's)
    # may still be moving the last messages, and their CPU is the sender's.
    await asyncio.get_running_loop().run_in_executor(None, done.wait, RESULT_TIMEOUT_S)
    cpu_s = time.process_time() - cpu_start
    results.put(("sender", cpu_s, cpu_s - sent * wake_s, in_calls_s, sent))
    await sender.close()


def _receiver_main(*args) -> None:
    uvloop.run(_receive(*args))


def _sender_main(*args) -> None:
    uvloop.run(_send(*args))


def measure(candidate: str, traffic: Traffic, duration_s: float) -> Row:
    """One sending and one receiving process, fresh, for one candidate and traffic."""
    context = multiprocessing.get_context("spawn")
    ready, done, results = context.Event(), context.Event(), context.Queue()
    with tempfile.TemporaryDirectory(prefix="ipc-") as directory:
        path = str(Path(directory) / "pipe")
        receiver = context.Process(
            target=_receiver_main, args=(candidate, traffic, path, ready, done, results)
        )
        receiver.start()
        if not ready.wait(RESULT_TIMEOUT_S):
            raise RuntimeError(f"{candidate}: the receiver did not start")
        sender = context.Process(
            target=_sender_main, args=(candidate, traffic, path, duration_s, done, results)
        )
        sender.start()
        reports = dict(
            (report[0], report[1:])
            for report in (results.get(timeout=RESULT_TIMEOUT_S) for _ in range(2))
        )
        for process in (sender, receiver):
            process.join(RESULT_TIMEOUT_S)
    send_cpu_s, send_net_s, send_calls_s, sent = reports["sender"]
    recv_cpu_s, recv_wall_s, latencies_ns = reports["receiver"]
    if len(latencies_ns) != sent:
        raise RuntimeError(f"{candidate}: {sent} messages sent, {len(latencies_ns)} received")
    entries = sent * traffic.entries
    latencies_us = sorted(ns / 1e3 for ns in latencies_ns)
    return Row(
        candidate=candidate,
        traffic=traffic,
        send_us_per_entry=send_cpu_s * 1e6 / entries,
        send_net_us_per_entry=send_net_s * 1e6 / entries,
        send_calls_us_per_entry=send_calls_s * 1e6 / entries,
        recv_us_per_entry=recv_cpu_s * 1e6 / entries,
        entries_per_s=entries / recv_wall_s,
        latency_p50_us=statistics.median(latencies_us),
        latency_p99_us=latencies_us[min(len(latencies_us) - 1, int(len(latencies_us) * 0.99))],
    )


def best_of(rows: list[Row]) -> Row:
    """Each column's best over repeated runs of one candidate and traffic."""
    return Row(
        candidate=rows[0].candidate,
        traffic=rows[0].traffic,
        send_us_per_entry=min(row.send_us_per_entry for row in rows),
        send_net_us_per_entry=min(row.send_net_us_per_entry for row in rows),
        send_calls_us_per_entry=min(row.send_calls_us_per_entry for row in rows),
        recv_us_per_entry=min(row.recv_us_per_entry for row in rows),
        entries_per_s=max(row.entries_per_s for row in rows),
        latency_p50_us=min(row.latency_p50_us for row in rows),
        latency_p99_us=min(row.latency_p99_us for row in rows),
    )


def format_table(rows: list[Row]) -> str:
    lines = [
        "| candidate | traffic | send us/entry | send net of wake-ups | in send calls "
        "| recv us/entry | entries/s at receiver | latency p50 us | latency p99 us |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.candidate} | {row.traffic.label} | {row.send_us_per_entry:.3f} "
            f"| {row.send_net_us_per_entry:.3f} | {row.send_calls_us_per_entry:.3f} "
            f"| {row.recv_us_per_entry:.3f} | {row.entries_per_s:,.0f} "
            + (
                f"| {row.latency_p50_us:,.0f} | {row.latency_p99_us:,.0f} |"
                if row.traffic.pace_s
                else "| (queued) | (queued) |"
            )
        )
    return "\n".join(lines)


def format_codec_table(entries: int, prompt_tokens: int, rounds: int) -> str:
    """The codecs alone, in this process: the floor under every transport's row."""
    lines = [
        f"| codec (in process) | encode us/entry x{entries} | decode us/entry x{entries} "
        f"| encode us/submit {prompt_tokens} ids | decode us/submit {prompt_tokens} ids |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, codec in CODECS.items():
        costs = [codec_costs(codec, entries, prompt_tokens, rounds) for _ in range(3)]
        best = {key: min(run[key] for run in costs) for key in costs[0]}
        lines.append(
            f"| {name} | {best['encode outputs']:.3f} | {best['decode outputs']:.3f} "
            f"| {best['encode submit']:.2f} | {best['decode submit']:.2f} |"
        )
    return "\n".join(lines)


def run(candidates, shapes, duration_s: float, repeat: int) -> list[Row]:
    return [
        best_of([measure(candidate, traffic, duration_s) for _ in range(repeat)])
        for traffic in shapes
        for candidate in candidates
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transport.measure", description=__doc__)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds of traffic a run")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the best is kept")
    parser.add_argument("--pace-ms", type=float, default=5.0, help="the paced runs' step time")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="token ids a submit")
    parser.add_argument(
        "--candidates", default=",".join(CANDIDATES), help="transport+codec, comma-separated"
    )
    args = parser.parse_args(argv)
    candidates = args.candidates.split(",")
    for candidate in candidates:
        transport, _, codec = candidate.partition("+")
        if transport not in TRANSPORTS or codec not in CODECS:
            parser.error(
                f"unknown candidate {candidate!r}: transport+codec of "
                f"{sorted(TRANSPORTS)} and {sorted(CODECS)}"
            )
    shapes = traffic_shapes(args.pace_ms / 1e3, args.prompt_tokens)
    print(format_table(run(candidates, shapes, args.duration, args.repeat)))
    print()
    rounds = max(1, int(args.duration * 500))
    print(format_codec_table(512, args.prompt_tokens, rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
