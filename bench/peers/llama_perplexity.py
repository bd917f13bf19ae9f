"""llama.cpp's `llama-perplexity` on a text file: where its binary is cached (built by
`make bench-peers` beside llama-server, bench/peers/build_llama_server.sh), how it is run,
and what its output says.

It tokenizes the whole file, cuts the ids into chunks of n_ctx tokens (dropping the
remainder), evaluates each chunk from an empty cache and scores the tokens of its second
half (bench/accuracy/chunks.py does the same for cbserve's paths). While it runs it
prints the running perplexity after each chunk, `[1]9.8765,[2]10.1234,...`, and at the
end `Final estimate: PPL = 10.1234 +/- 0.12345`.

    python -m bench.peers.llama_perplexity path   # the binary, or exit 1 with what to run
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.peers.llama_server import cache_dir, print_path

MISSING = "llama-perplexity is not built: run `make bench-peers` (builds it with llama-server once)"

_RUNNING = re.compile(r"\[(\d+)\]([-+0-9.eEnaif]+),")
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_SETUP = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")


def binary_path() -> Path | None:
    """The cached llama-perplexity, or None when `make bench-peers` has not built it."""
    path = cache_dir() / "bin" / "llama-perplexity"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def perplexity_argv(
    binary: Path, gguf: Path, text_file: Path, n_ctx: int, threads: int
) -> list[str]:
    """One sequence per batch (-b n_ctx): each chunk is one prefill, as ours are."""
    return [
        str(binary),
        "--model", str(gguf),
        "--file", str(text_file),
        "--ctx-size", str(n_ctx),
        "--batch-size", str(n_ctx),
        "--threads", str(threads),
        "--threads-batch", str(threads),
    ]  # fmt: skip


@dataclass(frozen=True)
class PerplexityRun:
    """What one llama-perplexity run printed."""

    perplexity: float
    plus_minus: float
    chunks: int
    n_ctx: int
    running: tuple[float, ...]  # the perplexity over chunks 1..k, for each k

    def __post_init__(self) -> None:
        if len(self.running) != self.chunks:
            raise ValueError(f"{len(self.running)} running values for {self.chunks} chunks")

    def per_chunk(self) -> tuple[float, ...]:
        """Each chunk's own perplexity, recovered from the running values (every chunk
        scores as many tokens, so chunk k's mean log-likelihood is k ln P_k minus
        (k - 1) ln P_(k-1)); as exact as the four printed decimals allow."""
        logs = [0.0, *(math.log(p) for p in self.running)]
        return tuple(math.exp(k * logs[k] - (k - 1) * logs[k - 1]) for k in range(1, len(logs)))


def parse_output(text: str) -> PerplexityRun:
    """The figures from llama-perplexity's stdout and stderr (in either order)."""
    final = _FINAL.search(text)
    setup = _SETUP.search(text)
    if final is None or setup is None:
        raise ValueError("no perplexity in llama-perplexity's output:\n" + text[-2000:])
    by_chunk = {int(k): float(v) for k, v in _RUNNING.findall(text)}
    return PerplexityRun(
        perplexity=float(final.group(1)),
        plus_minus=float(final.group(2)),
        chunks=int(setup.group(1)),
        n_ctx=int(setup.group(2)),
        running=tuple(by_chunk[k] for k in sorted(by_chunk)),
    )


def run(
    binary: Path, gguf: Path, text_file: Path, n_ctx: int, threads: int, timeout_s: float = 1800
) -> PerplexityRun:
    done = subprocess.run(
        perplexity_argv(binary, gguf, text_file, n_ctx, threads),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"llama-perplexity exited with {done.returncode}:\n{done.stdout[-2000:]}"
        )
    return parse_output(done.stdout)


def main(argv: list[str] | None = None) -> int:
    command = (argv if argv is not None else sys.argv[1:]) or ["path"]
    if command == ["path"]:
        return print_path(binary_path(), MISSING)
    print("usage: python -m bench.peers.llama_perplexity path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
