"""The core's limits and policies: the token budget, the sequence cap, batching, async
scheduling; what every per-worker Scheduler plans with (scheduler_svc/core/)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from common.flag_fields import BENCH, SERVE, flag
from scheduler_svc.config.kv_events import KVEventsConfig, parse_kv_events_config
from scheduler_svc.config.lora import LoraConfig, lora_config, split_lora_modules
from scheduler_svc.config.process import ENV_PREFIX
from scheduler_svc.config.speculative import SpeculativeConfig, parse_speculative_config

BATCHING_MODES = ("continuous", "static")
SPECULATIVE_DRAFTS = ("adaptive", "fixed")


@dataclass(frozen=True)
class SchedulerConfig:
    ENV_PREFIX: ClassVar[str] = ENV_PREFIX

    # Most sequences admitted (running) at once, hence most sequences in one step
    # (see max_running_seqs).
    max_num_seqs: int = flag(128, forwarded_by=(SERVE, BENCH), help="most sequences in one step")
    # Chunked prefill: a prompt longer than what is left of the budget is split
    # over several steps, after the decodes (one token each) have taken theirs.
    max_num_batched_tokens: int = flag(
        512,
        forwarded_by=(SERVE, BENCH),
        help="token budget of one step; longer prompts are prefilled in chunks",
    )
    # Past it Generate answers at once instead of growing an unbounded queue.
    max_waiting_requests: int = flag(
        1024,
        forwarded_by=(SERVE,),
        help="requests queued across all workers before Generate answers RESOURCE_EXHAUSTED",
    )
    # Multi-step decoding (vLLM's name): a step in which every running request is a
    # decode plans up to this many decode steps at once, which the worker runs back
    # to back, so the scheduler-worker round trip is paid once per K tokens. A
    # request that stops early drops the tokens sampled past its end; requests that
    # arrive meanwhile wait at most K - 1 more forwards.
    num_scheduler_steps: int = flag(
        1,
        forwarded_by=(SERVE, BENCH),
        help="decode steps one plan may cover when every running request is decoding "
        "(1: a plan per token)",
    )
    # Rebalance (workers/rebalance.py): a worker that must preempt moves the victim, with
    # its KV, to a worker with room instead of recomputing it later. Off: it preempts.
    kv_rebalance: bool = flag(
        True,
        forwarded_by=(SERVE,),
        help="a worker that must preempt moves the request, with its KV, to a worker with "
        "room instead (off: it preempts, the request is recomputed later)",
    )
    # Only full KV blocks are shared.
    enable_prefix_caching: bool = flag(
        True,
        forwarded_by=(SERVE,),
        help="share the KV of equal prompt prefixes between requests",
    )
    # How often requests behind a waiting request may be admitted while it does
    # not fit, before the queue stops at it until it does (no starvation).
    max_bypasses: int = 16
    # Fraction of the pool kept free when admitting beside running requests, so
    # that their decodes do not need a preemption at every block boundary.
    watermark: float = 0.01
    # "static" is the pre-continuous-batching baseline the benchmark compares against.
    batching: str = flag(
        "continuous",
        choices=BATCHING_MODES,
        forwarded_by=(SERVE,),
        help="continuous: requests join and leave at every step; static: a batch runs "
        "until all its requests finish before new ones join (a baseline)",
    )
    # Async scheduling (see workers/step_loop.py).
    async_scheduling: bool = flag(
        True,
        forwarded_by=(SERVE, BENCH),
        help="plan step N+1 while the worker runs step N, so that the worker never waits "
        "for the scheduler (stop checks lag one step; the extra token is dropped); only "
        "with continuous batching and --num-scheduler-steps 1",
    )

    # Speculative decoding without a draft model (config/speculative.py).
    speculative_config: str = flag(
        "",
        forwarded_by=(SERVE, BENCH),
        help="speculative decoding, vLLM's JSON: "
        '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\'; '
        "drafts come from the sequence's own earlier n-grams and are verified exactly; "
        "how many a step verifies is chosen per step (none where they would not pay)",
    )

    # vLLM verifies num_speculative_tokens drafts whenever they are found ("fixed");
    # "adaptive" weighs each draft's chance against its measured cost per step.
    speculative_drafts: str = flag(
        "adaptive",
        choices=SPECULATIVE_DRAFTS,
        forwarded_by=(SERVE, BENCH),
        help="with --speculative-config: adaptive: each step gives a decode the drafts "
        "likely to pay at this batch (its acceptance so far against the measured cost of a "
        "row; none at large batches); fixed: always num_speculative_tokens, as vLLM",
    )

    # KV-cache events for prefix-aware routers (config/kv_events.py, scheduler_svc/kv_events).
    kv_events_config: str = flag(
        "",
        forwarded_by=(SERVE,),
        help="publish KV-cache events as vLLM does, its JSON: "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
        '"replay_endpoint": "tcp://*:5558", "topic": "kv@POD_IP:PORT@MODEL"}\'; '
        "BlockStored when a full block enters the prefix cache, BlockRemoved when one is "
        "evicted, AllBlocksCleared at start (off when empty)",
    )

    # LoRA adapters, vLLM's flags (config/lora.py, scheduler_svc/lora/).
    enable_lora: bool = flag(
        False,
        switch=True,
        forwarded_by=(SERVE,),
        help="serve LoRA adapters: a request names one (gRPC lora_name, HTTP model); "
        "only workers started with --enable-lora are used",
    )
    lora_modules: list[str] = flag(
        default_factory=list,
        several=True,
        split=split_lora_modules,
        metavar="NAME=PATH",
        forwarded_by=(SERVE,),
        help="adapters to load at start, each name=path (a PEFT directory) or vLLM's JSON "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\'',
    )
    max_loras: int = flag(
        1, forwarded_by=(SERVE,), help="most distinct adapters in one step (the base not counted)"
    )
    max_lora_rank: int = flag(16, forwarded_by=(SERVE,), help="largest adapter rank accepted")
    max_cpu_loras: int | None = flag(
        None,
        default_help="--max-loras",
        forwarded_by=(SERVE,),
        help="adapters a worker keeps loaded (its slots, evicted least recently used); "
        "at least --max-loras",
    )

    def __post_init__(self) -> None:
        self.speculative  # noqa: B018 - parsed now, so that a bad flag fails at start
        self.kv_events  # noqa: B018 - the same for --kv-events-config
        self.lora  # noqa: B018 - the same for the LoRA flags
        positive = ("max_num_seqs", "max_num_batched_tokens", "max_waiting_requests")
        for name in (*positive, "num_scheduler_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(self.max_bypasses, bool) or not isinstance(self.max_bypasses, int):
            raise ValueError(f"max_bypasses must be an integer, got {self.max_bypasses!r}")
        if self.max_bypasses < 0:
            raise ValueError(f"max_bypasses must be >= 0, got {self.max_bypasses}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark!r}")
        if self.speculative_drafts not in SPECULATIVE_DRAFTS:
            raise ValueError(
                f"speculative_drafts must be one of {SPECULATIVE_DRAFTS}, "
                f"got {self.speculative_drafts!r}"
            )
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {BATCHING_MODES}, got {self.batching!r}")

    @cached_property
    def speculative(self) -> SpeculativeConfig | None:
        """--speculative-config parsed; None: speculation off."""
        return parse_speculative_config(self.speculative_config)

    @cached_property
    def kv_events(self) -> KVEventsConfig | None:
        """--kv-events-config parsed; None: no events published."""
        return parse_kv_events_config(self.kv_events_config)

    @cached_property
    def lora(self) -> LoraConfig | None:
        """The LoRA flags checked and parsed; None: LoRA off."""
        return lora_config(
            enable_lora=self.enable_lora,
            lora_modules=list(self.lora_modules),
            max_loras=self.max_loras,
            max_lora_rank=self.max_lora_rank,
            max_cpu_loras=self.max_cpu_loras,
        )

    @property
    def max_steps_in_flight(self) -> int:
        """Plans out at once on a worker: two with async scheduling, where it applies.

        A multi-step plan already hides the round trip behind its steps, and its
        lookahead needs every sample of the plan before it; static batching is the
        baseline of the old loop. Both keep one plan at a time.
        """
        applies = self.batching == "continuous" and self.num_scheduler_steps == 1
        return 2 if self.async_scheduling and applies else 1

    @property
    def max_running_seqs(self) -> int:
        """The cap on running sequences that the scheduler applies.

        A step must be able to give every running sequence its decode token, or
        the sequences at the back of the running queue would starve; so a budget
        smaller than max_num_seqs (handy to force chunking in tests) also caps
        the sequences. vLLM refuses such a config instead.
        """
        return min(self.max_num_seqs, self.max_num_batched_tokens)
