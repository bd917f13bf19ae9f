"""What one `cbserve bench speculation` run measures: its flags, validated once.

Each `flag(...)` field is a flag of `cbserve bench speculation` (python -m
bench.speculation.run), with the variable CBSERVE_BENCH_SPECULATION_<FLAG>.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bench.harness.spec_workloads import WORKLOADS
from common.flag_fields import flag
from scheduler_svc.config.speculative import SpeculativeConfig, parse_speculative_config

# Issue 32's setting: four drafts from a 2- to 4-token suffix match.
DEFAULT_SPECULATIVE_CONFIG = json.dumps(
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
)
SERVERS = ("cbserve", "llamacpp")
MIN_PROMPTS = 8


@dataclass(frozen=True)
class SpeculationBenchConfig:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_BENCH_SPECULATION_"

    workload: list[str] = flag(
        default_factory=lambda: list(WORKLOADS),
        choices=WORKLOADS,
        metavar="LIST",
        help="edit (fix a typo in a standard-library function: the reply repeats the "
        "prompt), summarize (standard-library docstrings), chat (ShareGPT, the control)",
    )
    concurrency: list[int] = flag(
        default_factory=lambda: [1, 64],
        metavar="LIST",
        help="client streams in flight at once, each measured in turn",
    )
    num_prompts: int | None = flag(
        None,
        default_help=f"2 x the concurrency, at least {MIN_PROMPTS}",
        help="requests per run",
    )
    seed: int = flag(0, help="which texts, and the request seeds")
    max_output_tokens: int = flag(256, help="cap on a request's max_tokens")
    ignore_eos: bool = flag(
        False,
        help="generate exactly max_tokens (off: a reply ends where the model ends it, so "
        "that drafts are judged on the model's own replies, not on text past its EOS)",
    )
    repeats: int = flag(1, help="off/on pairs per row, alternated (off on, on off, ...)")
    speculative_config: str = flag(
        DEFAULT_SPECULATIVE_CONFIG,
        help="the scheduler's --speculative-config for the `on` runs",
    )
    servers: list[str] = flag(
        default_factory=lambda: list(SERVERS),
        choices=SERVERS,
        metavar="LIST",
        help="cbserve, and llamacpp: llama-server without and with its own n-gram "
        "speculation (skipped, with a note, where it is not built: make bench-peers)",
    )
    llamacpp_spec_args: str = flag(
        "",
        default_help="--spec-type ngram-simple with the n-gram and draft sizes of "
        "--speculative-config",
        help="llama-server's speculation flags for its `on` runs, one string",
    )
    threads: int | None = flag(
        None,
        default_help="the worker's own default",
        help="compute threads of the worker and of llama-server alike",
    )
    worker_args: str = flag("", help="more worker flags, one string")
    scheduler_args: str = flag("", help="more scheduler flags, one string (both runs)")
    out_dir: Path = flag(Path("out/bench-speculation"), help="results.json and results.md go here")

    def __post_init__(self) -> None:
        if not self.workload or set(self.workload) - set(WORKLOADS):
            raise ValueError(f"workload must be some of {WORKLOADS}, got {self.workload}")
        if not self.servers or set(self.servers) - set(SERVERS):
            raise ValueError(f"servers must be some of {SERVERS}, got {self.servers}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1 each, got {self.concurrency}")
        for name in ("repeats", "max_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {self.num_prompts}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.speculative is None:
            raise ValueError("speculative_config must turn speculation on")
        for name in ("worker_args", "scheduler_args", "llamacpp_spec_args"):
            shlex.split(getattr(self, name))  # an unclosed quote fails here, not mid-run

    @property
    def speculative(self) -> SpeculativeConfig | None:
        return parse_speculative_config(self.speculative_config)

    def prompts_for(self, concurrency: int) -> int:
        return self.num_prompts or max(MIN_PROMPTS, 2 * concurrency)

    def worker_argv(self) -> list[str]:
        threads = ["--threads", str(self.threads)] if self.threads else []
        return threads + shlex.split(self.worker_args)

    def scheduler_argv(self, speculation: bool) -> list[str]:
        argv = shlex.split(self.scheduler_args)
        return argv + (["--speculative-config", self.speculative_config] if speculation else [])

    def llamacpp_spec_argv(self) -> list[str]:
        """llama-server's nearest to --speculative-config: `ngram-simple` looks up the
        last N tokens (N = prompt_lookup_min, the shortest match vLLM's proposer takes)
        and drafts the M that followed (M = num_speculative_tokens)."""
        if self.llamacpp_spec_args:
            return shlex.split(self.llamacpp_spec_args)
        spec = self.speculative
        return [
            "--spec-type", "ngram-simple",
            "--spec-ngram-simple-size-n", str(spec.prompt_lookup_min),
            "--spec-ngram-simple-size-m", str(spec.num_speculative_tokens),
        ]  # fmt: skip
