"""The worker's start-up settings, validated once so that nothing later re-checks them.

They are also `python -m worker_svc`'s flags (common.cli_config): each `flag(...)`
field is one, with the variable CBSERVE_WORKER_<FLAG>; those marked `forwarded_by`
are `cbserve serve`'s (and `cbserve bench`'s) too, passed on to every worker.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import ClassVar

from common.addresses import port_or_off
from common.defaults import DEFAULT_BLOCK_SIZE, DEFAULT_WORKER_PORT, default_model_path
from common.flag_fields import BENCH, SERVE, flag
from worker_svc.lora.limits import LoraLimits

# Compute paths (worker_svc/compute/paths.py; kept torch-free here for the CLI).
# "auto" takes the fastest one this machine has (compute/selection.py).
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "q4_1", "bfloat16-weights")
# vLLM's names: the own forward where one exists, or transformers' modules; "null"
# loads no weights and answers plans after a simulated step time (worker_svc/null/),
# so that the scheduler's capacity can be measured without a GPU (bench/scheduler_bench.py).
MODEL_IMPLS = ("auto", "cbserve", "transformers", "null")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "flash_attn")
# The KV pool's element type (vLLM's --kv-cache-dtype): "auto" is the compute path's
# activation dtype, but float16 for q4_1 on the CPU (kv_pool.AUTO_FLOAT16_PATHS). A
# 16-bit pool holds twice the tokens in the same memory and halves what a decode's
# attention reads; float32 stays the reference.
KV_CACHE_DTYPES = ("auto", "float32", "float16", "bfloat16")
# flash-attn attends with the KV cache in the query's dtype, which is 16-bit.
FLASH_KV_DTYPES = ("auto", "float16", "bfloat16")
# Default pool when neither a block count nor a byte budget is given: room for
# 64 sequences of 512 tokens, which is about 1.5 GB in float32 for the default model.
DEFAULT_KV_TOKENS = 64 * 512
# Measured per CPU by bench/kernel_bench.py; the table is worker_svc/compute/measured.py.
DEFAULT_DTYPE = "auto"

# On SIGTERM, seconds the scheduler gets to end the Step stream before the worker exits.
DEFAULT_GRACE_PERIOD_S = 30.0

# Compute paths whose compiled forward fails the closeness check against float32.
COMPILE_NOT_CLOSE = ("int8",)
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """`1073741824`, `1G`, `1GiB` and `1gb` are all 2**30 bytes: KV budgets are binary."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a byte count: {text!r}")
    number, unit = int(match.group(1)), match.group(2).lower()
    return number * 1024 ** "_kmgt".index(unit or "_")


@dataclass(frozen=True)
class WorkerConfig:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_WORKER_"

    model: str = flag(
        default_factory=default_model_path,
        metavar="PATH",
        forwarded_by=(SERVE,),
        default_help="$CBSERVE_MODEL, else the converted default model, else the packaged GGUF",
        help="HF directory or .gguf file",
    )
    # CBSERVE_DTYPE is the variable's first name; the test suite and scripts set it.
    dtype: str = flag(
        DEFAULT_DTYPE,
        choices=DTYPES,
        env_aliases=("CBSERVE_DTYPE",),
        forwarded_by=(SERVE, BENCH),
        help="compute path: auto takes the fastest this CPU has that is accurate enough to "
        "be a default (measured table, see bench/kernel_bench.py); float32 is the "
        "reference; int8 is int8 weights x int8 activations (fbgemm); bfloat16/float16 "
        "need native support on a CPU; q4_1 runs a GGUF's own blocks (a float checkpoint "
        "quantized to Q8_0 at load); bfloat16-weights is q4_1 with a float checkpoint's "
        "weights kept in bfloat16 (exact for a bfloat16 checkpoint) times float32 "
        "activations",
    )
    block_size: int = flag(DEFAULT_BLOCK_SIZE, forwarded_by=(SERVE,), help="tokens per KV block")
    # At most one of these two; with neither, DEFAULT_KV_TOKENS worth of blocks.
    num_kv_blocks: int | None = flag(
        None,
        excludes=("kv_cache_memory",),
        forwarded_by=(SERVE, BENCH),
        default_help=f"{DEFAULT_KV_TOKENS} tokens' worth",
        help="KV pool size in blocks",
    )
    kv_cache_memory: int | None = flag(
        None,
        parse=parse_bytes,
        excludes=("num_kv_blocks",),
        forwarded_by=(SERVE,),
        metavar="BYTES",
        help="KV pool size in bytes (2G, 512MiB, ...); exclusive with --num-kv-blocks",
    )
    kv_cache_dtype: str = flag(
        "auto",
        choices=KV_CACHE_DTYPES,
        forwarded_by=(SERVE, BENCH),
        help="KV pool element type: auto is the compute path's activation dtype, but float16 "
        "for q4_1 and bfloat16-weights on the CPU (as llama.cpp's default; it passes the "
        "same accuracy gate); "
        "float16 holds twice the tokens in the same --kv-cache-memory and halves what "
        "decode attention reads, rounding K/V to 11 significant bits; bfloat16 is read "
        "by the torch attention path only",
    )
    attention_backend: str = flag(
        "auto",
        choices=ATTENTION_BACKENDS,
        forwarded_by=(SERVE,),
        help="paged attention implementation",
    )
    model_impl: str = flag(
        "auto",
        choices=MODEL_IMPLS,
        forwarded_by=(SERVE,),
        help="cbserve: the own forward (worker_svc/models); transformers: its modules; "
        "auto: the own forward where the architecture has one",
    )
    # Off by default: on a 2-core CPU the compile at start takes minutes (bench/RESULTS.md,
    # "torch.compile on the own forward").
    compile: bool = flag(
        False,
        switch=True,
        help="run the own forward through torch.compile (Inductor): fewer operator calls "
        "a step, after compiling its graphs at start (minutes on a small CPU; cached on "
        "disk for the next start); needs the own forward",
    )
    # The null model's simulated step: a GPU's step costs a fixed part (weights read once
    # per step) plus a part per token (prefill chunks cost more than decodes).
    null_step_ms: float = flag(
        0.0,
        forwarded_by=(SERVE,),
        metavar="MS",
        help="with --model-impl null: every step takes at least this long (per step of a "
        "multi-step plan)",
    )
    null_step_us_per_token: float = flag(
        0.0,
        forwarded_by=(SERVE,),
        metavar="US",
        help="with --model-impl null: and this much more per scheduled token",
    )
    null_eos_probability: float = flag(
        0.0,
        forwarded_by=(SERVE,),
        metavar="P",
        help="with --model-impl null: the chance that a sampled token is EOS (0: never, so "
        "requests run to max_tokens)",
    )
    # "auto" picks cuda:0 when torch sees a GPU, else cpu.
    device: str = flag("auto", forwarded_by=(SERVE,), help="auto, cpu, cuda, cuda:N")
    # Not the benchmark's: its --threads is llama-server's too (bench/options.py).
    threads: int | None = flag(
        None,
        forwarded_by=(SERVE,),
        default_help="torch's choice",
        help="torch intra-op threads",
    )
    # LoRA adapters, vLLM's flags (worker_svc/lora); `cbserve serve` gives the scheduler
    # the same ones (cbserve/launch.py shared_flags).
    enable_lora: bool = flag(
        False, switch=True, forwarded_by=(SERVE,), help="hold adapters the scheduler loads"
    )
    max_loras: int = flag(1, forwarded_by=(SERVE,), help="with --enable-lora: most adapters a step")
    max_lora_rank: int = flag(16, forwarded_by=(SERVE,), help="with --enable-lora: largest rank")
    max_cpu_loras: int | None = flag(
        None, default_help="--max-loras", forwarded_by=(SERVE,), help="with --enable-lora: slots"
    )
    host: str = flag("0.0.0.0", help="address to listen on")
    port: int = flag(DEFAULT_WORKER_PORT, help="the gRPC port the scheduler connects to")
    # Off by default, so that several workers on one host need no port each.
    metrics_port: int = flag(
        0,
        help="serve Prometheus metrics (forward time per step) at http://HOST:PORT/metrics; "
        "0 turns them off",
    )
    grace_period_s: float = flag(
        DEFAULT_GRACE_PERIOD_S,
        name="grace-period",
        metavar="SECONDS",
        help="on SIGTERM: health NOT_SERVING, and the open Step stream gets this long to "
        "be closed by its scheduler before the worker ends it and exits",
    )
    log_level: str = flag("info", help="debug, info, warning, error")
    kv_transfer_shm: bool = flag(True, help="KV moving to a worker on this host uses shared memory")
    # On (where memfd_create exists): attention measured as fast on its 4 KiB pages.
    kv_pool_shared: bool = flag(True, help="the CPU KV pool in shared memory (one-copy KV moves)")
    # TLS on the worker's port, so that a port reachable on a network is not an open
    # door: the scheduler checks the worker's certificate (its --worker-tls-ca), and
    # with --tls-client-ca the worker checks the scheduler's (mutual TLS).
    tls_cert: str | None = flag(
        None, metavar="PEM", help="serve the Worker service over TLS with this certificate"
    )
    tls_key: str | None = flag(None, metavar="PEM", help="the private key of --tls-cert")
    tls_client_ca: str | None = flag(
        None,
        metavar="PEM",
        help="with --tls-cert: accept only clients (schedulers) whose certificate this CA "
        "signed (the scheduler's --worker-tls-cert)",
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model path must not be empty")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_kv_blocks is not None and self.kv_cache_memory is not None:
            raise ValueError("give num_kv_blocks or kv_cache_memory, not both")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be positive, got {self.kv_cache_memory}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                f"got {self.attention_backend!r}"
            )
        self._check_kv_cache_dtype()
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {MODEL_IMPLS}, got {self.model_impl!r}")
        if self.compile and self.model_impl == "transformers":
            raise ValueError("compile needs the own forward, not --model-impl transformers")
        if self.compile and self.dtype in COMPILE_NOT_CLOSE:
            # Inductor fuses the reductions ahead of the 8-bit quantization and rounds
            # differently: compiled int8 left float32's top-5 at token 11 of one of the 16
            # prompts of tests/worker/test_compute_paths_close.py, which eager int8 passes.
            raise ValueError(
                f"compile with dtype {self.dtype} is not logprobs-close to float32; "
                "use --dtype float32 with --compile, or int8 without it"
            )
        self._check_null_model()
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        LoraLimits(self.max_cpu_loras, self.max_loras, self.max_lora_rank)  # a typo is refused
        if self.enable_lora and self.model_impl == "transformers":
            raise ValueError("enable_lora needs the own forward, not --model-impl transformers")
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"threads must be positive, got {self.threads}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        object.__setattr__(self, "metrics_port", port_or_off("metrics_port", self.metrics_port))
        grace = self.grace_period_s
        if not grace > 0 or math.isinf(grace):
            raise ValueError(f"grace_period_s must be a number of seconds > 0, got {grace}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert (client certificates need TLS)")

    def _check_kv_cache_dtype(self) -> None:
        kv = self.kv_cache_dtype
        if kv not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv!r}")
        if self.attention_backend == "flash_attn":
            # Its kernels take q, k and v in one 16-bit dtype: a float32 pool, or a pool
            # in the other 16-bit type than the model's, cannot be read by them.
            if kv not in FLASH_KV_DTYPES:
                raise ValueError(
                    f"kv_cache_dtype {kv} cannot be read by attention backend flash_attn "
                    "(16-bit, the model's dtype); use --kv-cache-dtype auto"
                )
            if kv != "auto" and self.dtype in ("float16", "bfloat16") and kv != self.dtype:
                raise ValueError(
                    f"attention backend flash_attn needs the KV cache in the model's dtype "
                    f"{self.dtype}, got --kv-cache-dtype {kv}; use --kv-cache-dtype auto"
                )
        if self.attention_backend == "cpu" and kv == "bfloat16":
            raise ValueError(
                "attention backend cpu reads float32 or float16 KV caches, not bfloat16; "
                "use --kv-cache-dtype float16, or --attention-backend torch"
            )

    def _check_null_model(self) -> None:
        null_flags = {
            "null_step_ms": self.null_step_ms,
            "null_step_us_per_token": self.null_step_us_per_token,
            "null_eos_probability": self.null_eos_probability,
        }
        for name, value in null_flags.items():
            if not 0 <= value < math.inf:  # also refuses NaN
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.null_eos_probability > 1:
            raise ValueError(
                f"null_eos_probability must be at most 1, got {self.null_eos_probability}"
            )
        if self.model_impl != "null":
            given = [name for name, value in null_flags.items() if value]
            if given:
                # A simulated step time on a real model would silently do nothing.
                raise ValueError(f"{given[0]} needs model_impl null, got {self.model_impl!r}")
        elif self.compile:
            raise ValueError("compile has nothing to compile with model_impl null")

    def credentials(self):
        """The port's grpc.ServerCredentials: TLS with --tls-cert/--tls-key, mutual TLS
        with --tls-client-ca; None for plaintext. Reads and checks the PEM files, raising
        common.tls.TlsError (a ValueError) naming the flag and file that is wrong."""
        if self.tls_cert is None:
            return None
        from common.tls import server_credentials  # grpc: only where a port is served

        return server_credentials(self.tls_cert, self.tls_key, self.tls_client_ca)

    @property
    def lora_limits(self) -> LoraLimits | None:
        """--max-cpu-loras, --max-loras, --max-lora-rank; None without --enable-lora."""
        limits = LoraLimits(self.max_cpu_loras, self.max_loras, self.max_lora_rank)
        return limits if self.enable_lora else None

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
