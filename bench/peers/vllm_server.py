"""One vLLM CPU server as the benchmark starts it: its command line, its environment
(cores and KV memory), and the child process on a loopback port.

Started as a new user serving this load would start it, on vLLM's defaults but for what
must match cbserve's stack for the comparison to mean anything:
- the same model directory (vLLM loads the HF checkpoint; it does not take our GGUF);
- `--max-model-len` as cbserve's (the checkpoint's max_position_embeddings, which is
  what cbserve's worker announces);
- a KV cache sized like cbserve's pool (`VLLM_CPU_KVCACHE_SPACE`, whole GiB, at least 1:
  vLLM takes no smaller unit);
- the same cores: `VLLM_CPU_OMP_THREADS_BIND=0-<n-1>` for the bench's n threads. vLLM's
  own default ("auto") leaves one core to its engine loop, so on 2 cores it computes on
  one; the binding used is recorded beside the results (`--vllm-bind auto` measures it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.peers.health_wait import wait_healthy

START_TIMEOUT_S = 600.0  # loading, and on first start compiling its CPU kernels' plans
VLLM_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_VLLM_DTYPE = "bfloat16"  # vLLM's own default on a CPU
BINDINGS = ("threads", "auto")
GIB = 2**30
ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
SERVED_NAME = "cbserve-bench-model"
# The parent's variables that would point vLLM's python at cbserve's venv, or change its
# thread count behind the binding's back.
DROPPED_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class VllmLaunch:
    """What one vLLM server is started with; validated here, so that a wrong setting
    fails before a minute of loading."""

    model_dir: Path
    dtype: str
    threads: int
    binding: str
    kv_cache_gib: int
    max_model_len: int

    def __post_init__(self) -> None:
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"vLLM's dtype must be one of {VLLM_DTYPES}, got {self.dtype!r}")
        if self.binding not in BINDINGS:
            raise ValueError(f"--vllm-bind must be one of {BINDINGS}, got {self.binding!r}")
        if self.threads < 1 or self.kv_cache_gib < 1 or self.max_model_len < 1:
            raise ValueError(
                "threads, KV GiB and max model length must be >= 1, got "
                f"{self.threads}, {self.kv_cache_gib}, {self.max_model_len}"
            )

    @property
    def cores(self) -> str | None:
        """VLLM_CPU_OMP_THREADS_BIND's value: cores 0..threads-1, or None for vLLM's auto."""
        if self.binding == "auto":
            return None
        return "0" if self.threads == 1 else f"0-{self.threads - 1}"

    def describe(self) -> dict:
        """What results.json records beside the column."""
        return {
            "dtype": self.dtype,
            "binding": f"VLLM_CPU_OMP_THREADS_BIND={self.cores or 'auto'}",
            "kv_cache_space_gib": self.kv_cache_gib,
            "max_model_len": self.max_model_len,
        }


def server_argv(python: Path, launch: VllmLaunch, port: int) -> list[str]:
    # `python -m` the server module: the `vllm` console script of the vllm-cpu
    # distribution looks for a distribution named vllm and fails.
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(launch.model_dir),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", launch.dtype,
        "--max-model-len", str(launch.max_model_len),
        "--seed", "0",
        "--disable-uvicorn-access-log",  # a line per request otherwise, in the timed run
    ]  # fmt: skip


def server_env(launch: VllmLaunch, parent: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in (os.environ if parent is None else parent).items()}
    for name in DROPPED_ENV:
        env.pop(name, None)
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    if launch.cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = launch.cores
    env["VLLM_CPU_KVCACHE_SPACE"] = str(launch.kv_cache_gib)
    # A local directory, no network: no hub lookups, no usage report.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    env["DO_NOT_TRACK"] = "1"
    return env


def model_config(model_dir: Path) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config.get("text_config", config)


def kv_bytes_per_token(config: dict, dtype: str) -> int:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads") or heads
    return config["num_hidden_layers"] * 2 * kv_heads * head_dim * ELEMENT_BYTES[dtype]


def kv_cache_gib(config: dict, dtype: str, pool_tokens: int | None, pool_bytes: int | None) -> int:
    """cbserve's pool in vLLM's unit: the same memory where cbserve was given bytes, else
    the same number of tokens in vLLM's dtype; whole GiB rounded up, at least 1."""
    wanted = (
        pool_bytes if pool_bytes is not None else pool_tokens * kv_bytes_per_token(config, dtype)
    )
    return max(1, math.ceil(wanted / GIB))


class VllmServer:
    """One vLLM server child process; a context manager. Its log goes to a file (it
    prints every step's statistics), whose tail is shown when it fails to start."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.argv, self.env, self.log_path = argv, env, log_path
        self.url = f"http://127.0.0.1:{port}"
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> VllmServer:
        with open(self.log_path, "wb") as log:
            # Its own session: vLLM starts an engine-core child, which stop() ends with it.
            self._process = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        wait_healthy(
            "vLLM", self._process, self.url, timeout_s, self._log_tail, self.stop, poll_s=0.5
        )
        return self

    def _log_tail(self) -> str:
        if not self.log_path.exists():
            return ""
        return ":\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])

    def stop(self) -> None:
        if self._process is None:
            return
        # SIGTERM to the API server, which stops the engine core it started; then
        # SIGKILL to whatever of its process group is left.
        if self._process.poll() is None:
            self._process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
