"""llama.cpp's `llama-server`, the peer a CPU user would otherwise pick: where its
binary is cached, how it is built (`make bench-peers`), and one running server.

The binary is built from the llama.cpp source vendored by the llama-cpp-python sdist
at the version pinned here, by bench/peers/build_llama_server.sh, into a cache outside the
repository (`$CBSERVE_PEERS_CACHE`, else ~/.cache/cbserve), so that no test and no
clone needs it and every clone on the machine shares it.

    python -m bench.peers.llama_server build   # what `make bench-peers` runs
    python -m bench.peers.llama_server path    # the binary, or exit 1 with what to run

The same build caches llama-perplexity beside it (bench/peers/llama_perplexity.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from bench.peers.health_wait import wait_healthy

# The llama.cpp that is measured: llama-cpp-python 0.3.36 (2026-10) vendors it.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BUILD_SCRIPT = Path(__file__).with_name("build_llama_server.sh")
MISSING = "llama-server is not built: run `make bench-peers` (builds it once, about 10 minutes)"
START_TIMEOUT_S = 120.0


def cache_dir() -> Path:
    root = os.environ.get("CBSERVE_PEERS_CACHE") or Path.home() / ".cache" / "cbserve"
    return Path(root) / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION


def binary_path() -> Path | None:
    """The cached llama-server, or None when `make bench-peers` has not built it."""
    path = cache_dir() / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def build() -> int:
    env = {
        **os.environ,
        "LLAMA_CPP_PYTHON_VERSION": LLAMA_CPP_PYTHON_VERSION,
        "CBSERVE_PEERS_CACHE": str(cache_dir().parent.parent),
        "PYTHON": sys.executable,  # its pip downloads the sdist
    }
    return subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, check=False).returncode


def server_argv(
    binary: Path, gguf: Path, port: int, parallel: int, threads: int, context: int
) -> list[str]:
    """How the bench starts it: what a user serving `parallel` clients would type,
    with every slot given room for the longest request (llama-server splits the
    context evenly between its slots)."""
    return [
        str(binary),
        "--model", str(gguf),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(parallel),
        "--threads", str(threads),
        "--threads-batch", str(threads),
        "--ctx-size", str(context),
        "--no-webui",
    ]  # fmt: skip


def context_size(parallel: int, longest_request_tokens: int) -> int:
    """Total context for `parallel` slots that each hold the longest request."""
    return parallel * (longest_request_tokens + 16)


class LlamaServer:
    """One llama-server child process on a loopback port; a context manager."""

    def __init__(self, argv: list[str], port: int, log_path: Path | None = None) -> None:
        self.argv = argv
        self.url = f"http://127.0.0.1:{port}"
        self._log_path = log_path
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> LlamaServer:
        # Its log is long (every slot, every request): kept in a file, shown on failure.
        log = open(self._log_path, "wb") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(self.argv, stdout=log, stderr=log)
        finally:
            if self._log_path:
                log.close()
        wait_healthy(
            "llama-server",
            self._process,
            self.url,
            timeout_s,
            self._log_tail,
            self.stop,
            poll_s=0.2,
        )
        return self

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's token ids for `text` as llama-perplexity gets them (its
        common_tokenize with add_special on, special tokens in the text not parsed)."""
        body = {"content": text, "add_special": True, "parse_special": False}
        return self._post("/tokenize", body, timeout_s=60.0)["tokens"]

    def greedy_tokens(self, prompt_ids: list[int], count: int) -> list[int]:
        """The first `count` token ids llama.cpp samples greedily after `prompt_ids`
        (its own arithmetic: Q8 activation blocks against the GGUF's blocks), EOS not
        stopping it, as the accuracy bench's greedy replies are made."""
        body = {
            "prompt": prompt_ids,
            "n_predict": count,
            "temperature": 0.0,
            "top_k": 1,
            "ignore_eos": True,
            "cache_prompt": False,
            "return_tokens": True,
        }
        return self._post("/completion", body, timeout_s=300.0)["tokens"]

    def _post(self, path: str, body: dict, timeout_s: float) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def _log_tail(self) -> str:
        if not self._log_path or not self._log_path.exists():
            return ""
        lines = self._log_path.read_text(errors="replace").splitlines()
        return ":\n" + "\n".join(lines[-15:])

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def print_path(path: Path | None, missing: str) -> int:
    """`python -m bench.peers.<tool> path`: the cached binary on stdout, or what to run."""
    print(path if path else missing, file=sys.stdout if path else sys.stderr)
    return 0 if path else 1


def main(argv: list[str] | None = None) -> int:
    command = (argv if argv is not None else sys.argv[1:]) or ["path"]
    if command == ["build"]:
        return build()
    if command == ["path"]:
        return print_path(binary_path(), MISSING)
    print("usage: python -m bench.peers.llama_server [build|path]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
