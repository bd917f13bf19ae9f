"""What one `cbserve bench` run measures: its flags, named as in `vllm bench serve`.

Each `flag(...)` field is a flag of `cbserve bench` (bench/serving/options.py builds the
parser), with the variable CBSERVE_BENCH_<FLAG>. The flags a local stack is started
with (--dtype, --max-num-seqs, ...) are the worker's and the scheduler's own, declared
on their configs. Kept free of heavy imports, so that building the `cbserve` command
line stays quick for its other subcommands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bench.peers.vllm_server import BINDINGS as VLLM_BINDINGS
from bench.peers.vllm_server import DEFAULT_VLLM_DTYPE, VLLM_DTYPES
from common.flag_fields import flag

BASELINES = ("static", "hf", "llamacpp", "vllm")
# How the measured system is reached: cbserve's gRPC API, or any server that speaks the
# OpenAI completions API (cbserve's HTTP front, llama-server, vLLM, ...).
BACKENDS = ("cbserve", "openai")
# transformers' dtypes (the hf baseline).
DTYPES = ("float32", "bfloat16", "float16")
WORKLOAD = "workload"
ARRIVALS = "arrivals and requests"
TARGET = "what is measured"
OUTPUT = "output"


def _rate(text: str) -> float:
    rate = float(text)
    if not rate > 0:  # also refuses nan
        raise ValueError(f"request rates must be > 0 (or inf), got {text!r}")
    return rate


@dataclass(frozen=True)
class BenchConfig:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_BENCH_"

    dataset: str = flag("sharegpt", choices=("sharegpt", "random"), group=WORKLOAD, help="prompts")
    num_prompts: int = flag(200, group=WORKLOAD, help="requests sent")
    seed: int = flag(0, group=WORKLOAD, help="sampling, arrivals, request seeds")
    max_output_tokens: int = flag(
        256, group=WORKLOAD, help="cap on a ShareGPT request's max_tokens (its reply's length)"
    )
    random_input_len: str = flag(
        "16:128", metavar="N|LOW:HIGH", group=WORKLOAD, help="--dataset random's prompt lengths"
    )
    random_output_len: str = flag(
        "16:256", metavar="N|LOW:HIGH", group=WORKLOAD, help="--dataset random's max_tokens"
    )

    request_rate: list[float] = flag(
        default_factory=list,
        parse=_rate,
        several=True,
        metavar="R",
        default_help="inf",
        group=ARRIVALS,
        help="requests/s; inf sends all at once; several (1 2 4 or 1,2,4) run in turn",
    )
    burstiness: float = flag(1.0, group=ARRIVALS, help="gamma shape; 1 = Poisson")
    max_concurrency: int | None = flag(None, group=ARRIVALS, help="requests in flight at most")
    temperature: float = flag(0.0, group=ARRIVALS, help="0: greedy")
    # vLLM's `bench serve` sends a ShareGPT request with max_tokens = the reply's length
    # but leaves ignore_eos off unless --ignore-eos is given. Here it is on by default:
    # transformers' batched generate can only run every row for a fixed count, and the
    # continuous/static/transformers ratios are only fair when every system produces the
    # same tokens (a system that stops early at EOS would look faster for doing less).
    # --no-ignore-eos gives vLLM's default.
    ignore_eos: bool = flag(
        True,
        group=ARRIVALS,
        help="generate exactly max_tokens per request (vLLM's default is off)",
    )
    lora_modules: list[str] = flag(
        default_factory=list,
        several=True,
        metavar="NAME[=PATH]",
        group=ARRIVALS,
        help="LoRA adapters the requests name as their model, spread by --lora-assignment "
        "(no request goes to the base); NAME=PATH also loads the PEFT directory on the local "
        "stack started (--enable-lora)",
    )
    lora_assignment: str = flag(
        "random",
        choices=("random", "round-robin"),
        group=ARRIVALS,
        help="how requests are spread over --lora-modules: random (seeded by --seed) or "
        "round-robin",
    )
    lora_beside_base: bool = flag(
        False,
        switch=True,
        group=ARRIVALS,
        help="with --lora-modules: the same requests on the base too, on the same stack's "
        "flags, with the ratio (the issue's adapters-vs-base figure)",
    )
    goodput: list[str] = flag(
        default_factory=list,
        several=True,
        metavar="NAME:MS",
        group=ARRIVALS,
        help="SLOs: ttft, tpot, e2el",
    )

    backend: str = flag(
        "cbserve",
        choices=BACKENDS,
        group=TARGET,
        help="cbserve: its gRPC API (a local stack, or --server); openai: the streaming "
        "/v1/completions of the OpenAI-compatible server at --base-url",
    )
    base_url: str | None = flag(
        None,
        metavar="URL",
        group=TARGET,
        help="--backend openai's server, e.g. http://localhost:8000/v1 (with or without /v1)",
    )
    served_model_name: str | None = flag(
        None,
        metavar="NAME",
        default_help="the first model the server's /v1/models lists",
        group=TARGET,
        help="--backend openai: the `model` field sent (vLLM's name for it; --model is the "
        "workload's tokenizer directory)",
    )
    api_key: str | None = flag(
        None,
        metavar="KEY",
        env_aliases=("CBSERVE_API_KEY",),
        group=TARGET,
        help="sent as `Authorization: Bearer KEY` (HTTP) or `authorization` metadata (gRPC); "
        "never written to the results",
    )
    server: str | None = flag(None, metavar="HOST:PORT", group=TARGET, help="a running stack")
    metrics_url: str | None = flag(
        None, group=TARGET, help="its scheduler's /metrics, read around each rate"
    )
    baselines: list[str] = flag(
        default_factory=list,
        choices=BASELINES,
        metavar="LIST",
        group=TARGET,
        help="comma-separated, from static (cbserve --batching static), "
        "hf (transformers generate), llamacpp (llama.cpp's llama-server: make bench-peers), "
        "vllm (vLLM's CPU build on the same model directory: make bench-peers)",
    )
    threads: int | None = flag(
        None,
        default_help="the worker's own default, torch's thread count",
        group=TARGET,
        help="compute threads of the worker and of llama-server and vLLM alike",
    )
    model: Path | None = flag(
        None,
        metavar="DIR|FILE.gguf",
        default_help="the converted default model",
        group=TARGET,
        help="HF model directory, or a GGUF file (llama-server serves the same file)",
    )
    hf_dtype: str | None = flag(
        None,
        choices=DTYPES,
        default_help="--dtype where transformers has it, else float32",
        group=TARGET,
        help="transformers' dtype",
    )
    hf_batch_size: int = flag(64, group=TARGET, help="rows of transformers' batched generate")
    vllm_dtype: str = flag(
        DEFAULT_VLLM_DTYPE, choices=VLLM_DTYPES, group=TARGET, help="the vllm baseline's --dtype"
    )
    vllm_bind: str = flag(
        "threads",
        choices=VLLM_BINDINGS,
        group=TARGET,
        help="the vllm baseline's cores: threads binds its OpenMP threads to cores "
        "0..--threads-1; auto is vLLM's own default, which leaves one core to its engine loop",
    )
    worker_args: str = flag("", group=TARGET, help="more worker flags, one string")
    scheduler_args: str = flag("", group=TARGET, help="more scheduler flags, one string")

    out_dir: Path = flag(Path("out/bench"), metavar="DIR", group=OUTPUT, help="results and plots")
    no_plots: bool = flag(False, switch=True, group=OUTPUT, help="write no PNG plots")
    no_progress: bool = flag(False, switch=True, group=OUTPUT, help="draw no progress bar")

    def __post_init__(self) -> None:
        # The messages name the flags: they are printed as they are.
        if self.num_prompts < 1:
            raise ValueError("--num-prompts must be >= 1")
        if self.burstiness <= 0:
            raise ValueError("--burstiness must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("--max-concurrency must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if self.server and "static" in self.baselines:
            raise ValueError(
                "the static baseline starts its own stack: leave out --server or the baseline"
            )
        _check_backend(self)
        from bench.harness.lora_assignment import LoraModules

        LoraModules.parse(self.lora_modules)  # a ValueError naming the bad entry
        if self.lora_beside_base and (not self.lora_modules or self.backend != "cbserve"):
            raise ValueError("--lora-beside-base needs --lora-modules and --backend cbserve")
        if self.lora_modules and self.baselines:
            raise ValueError(
                "--lora-modules: the baselines serve the base model only; run them without it"
            )
        for flag_name, lengths in (
            ("--random-input-len", self.random_input_len),
            ("--random-output-len", self.random_output_len),
        ):
            _lengths(flag_name, lengths)
        from bench.harness.metrics import parse_goodput

        parse_goodput(self.goodput)  # a ValueError naming the bad NAME:MS

    @property
    def rates(self) -> list[float]:
        """The request rates in the order given, once each; all at once when none."""
        return list(dict.fromkeys(self.request_rate)) or [math.inf]

    @property
    def input_len(self) -> tuple[int, int]:
        return _lengths("--random-input-len", self.random_input_len)

    @property
    def output_len(self) -> tuple[int, int]:
        return _lengths("--random-output-len", self.random_output_len)

    @property
    def slos(self) -> dict[str, float]:
        """--goodput as {"ttft": ms, ...}."""
        from bench.harness.metrics import parse_goodput

        return parse_goodput(self.goodput)


def _check_backend(config: BenchConfig) -> None:
    if config.backend == "openai":
        if not config.base_url:
            raise ValueError("--backend openai needs --base-url URL")
        if not config.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"--base-url must start with http:// or https://, got {config.base_url!r}"
            )
        if config.server:
            raise ValueError("--server is the gRPC backend's: --backend openai takes --base-url")
        if "static" in config.baselines:
            raise ValueError(
                "the static baseline is cbserve's gRPC stack: not with --backend openai"
            )
    elif config.base_url or config.served_model_name:
        raise ValueError("--base-url and --served-model-name need --backend openai")


def _lengths(flag_name: str, text: str) -> tuple[int, int]:
    from bench.harness.workload import parse_range

    try:
        return parse_range(text)
    except ValueError as error:
        raise ValueError(f"{flag_name}: {error}") from None
