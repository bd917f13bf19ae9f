"""`--model-impl null`: the real worker with no model, for measuring the scheduler.

It loads no weights and allocates no KV pool; it reads only what it must describe
(the model's config.json: vocabulary, length, KV shape; its tokenizer: which ids are
ordinary text, which is EOS). Everything else is the real worker's: the server, the
plan validation and the runner's bookkeeping (ModelRunner.execute and its sequence
states and block tables), so the worker's own per-step Python is in what is measured.
Only the forward is replaced: each step samples real token ids (null_sampler.py) and
the plan is answered no sooner than the simulated step time after it arrived,

    step time = --null-step-ms + --null-step-us-per-token x scheduled tokens

per step of a multi-step plan. The bookkeeping runs inside that time, as a GPU
worker's input preparation runs inside its step, so the step time is what the flags
say unless the Python alone takes longer. StepResult.forward_seconds (and the worker's
cbserve_worker_forward_seconds) is the whole time spent in the runner: its sum over
a run, divided by the wall time, is how busy the worker was.

Prompt logprobs are answered in the protocol's shape with made-up values (each
prompt token as the most likely one, as NullSampler.logprobs makes them): the
scheduler's side of them runs as it does on a real worker, no number means anything.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from cbserve.worker.v1 import worker_pb2
from worker_svc.config import WorkerConfig
from worker_svc.kv_pool import KVPool, KVPoolSpec, kv_cache_dtype
from worker_svc.model_runner import ModelRunner, record_sample
from worker_svc.models.config_file import attention_dims, read_declared_config
from worker_svc.null_sampler import NullSampler, NullVocabulary, ordinary_token_ids
from worker_svc.null_tokenizer import read_tokenizer_files
from worker_svc.prompt_logprobs import prompt_rows
from worker_svc.sequence import SequenceState
from worker_svc.token_bitmask import allowed_ids


@dataclass(frozen=True)
class NullModel:
    """The model as the runner and Describe see it; there are no weights behind it."""

    name: str
    vocab_size: int
    max_model_len: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    model_impl: str = "null"
    compute_path: str = "null"


@dataclass(frozen=True)
class StepTimeModel:
    step_ms: float = 0.0
    us_per_token: float = 0.0

    def __post_init__(self) -> None:
        if min(self.step_ms, self.us_per_token) < 0:
            raise ValueError(f"step times must be >= 0, got {self}")

    def seconds(self, num_tokens: int) -> float:
        return self.step_ms / 1e3 + self.us_per_token / 1e6 * num_tokens


class NullKVPool(KVPool):
    """A pool of block ids with no memory behind them: only range checks need it."""

    def __init__(self, spec: KVPoolSpec, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks

    @property
    def num_bytes(self) -> int:
        return 0


class NullRunner(ModelRunner):
    def __init__(
        self, model: NullModel, pool: KVPool, sampler: NullSampler, step_time: StepTimeModel
    ):
        super().__init__(model, pool, backend=None, sampler=sampler)
        self.step_time = step_time
        self._simulated_s = 0.0

    def execute(self, plan: worker_pb2.StepPlan) -> worker_pb2.StepResult:
        started = time.perf_counter()
        self._simulated_s = 0.0
        result = super().execute(plan)
        # Sleep, not spin: the machines this runs on have few cores, and a spinning
        # worker would take them from the scheduler it is there to measure.
        remaining = started + self._simulated_s - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        result.forward_seconds = time.perf_counter() - started
        return result

    def _run(
        self, work: list[tuple[SequenceState, int]], result: worker_pb2.StepResult
    ) -> list[SequenceState]:
        """One simulated forward, with the real one's effect on the sequences and the
        result (ModelRunner._run): computed counts advance, sampling rows append a token."""
        samplers: list[SequenceState] = []
        num_tokens = 0
        for seq, n in work:
            num_tokens += n
            rows = prompt_rows(seq, seq.num_computed_tokens, seq.num_computed_tokens + n)
            if rows is not None:
                result.prompt_logprobs.append(self._made_up_prompt_logprobs(rows))
            seq.num_computed_tokens += n
            if seq.num_computed_tokens == seq.num_tokens:
                samplers.append(seq)
        self._simulated_s += self.step_time.seconds(num_tokens)
        if not samplers:
            return []
        first_step = not result.token_ids
        tokens = self.sampler.sample(samplers)
        if self.allowed_tokens:
            tokens = self._within_masks(samplers, tokens)
        for seq, token in zip(samplers, tokens, strict=True):
            # Not seq.append_token: its penalty counts are tensors, and no torch op
            # runs per step here (penalties do not change which ids are drawn).
            seq.token_ids.append(token)
            wanted = seq.sampling.logprobs
            logprobs = self.sampler.logprobs(token, wanted) if wanted else None
            record_sample(result, seq.seq_id, token, logprobs, first_step)
        return samplers

    def _made_up_prompt_logprobs(self, rows) -> worker_pb2.PromptLogprobs:
        first, num_top = rows.first_position, rows.seq.prompt_logprobs
        result = worker_pb2.PromptLogprobs(
            seq_id=rows.seq.seq_id, first_position=first, num_top=num_top
        )
        for token in rows.seq.token_ids[first : first + rows.num_rows]:
            made_up = self.sampler.logprobs(token, max(num_top, 1))
            result.logprobs.append(made_up.logprob)
            result.top_token_ids.extend(made_up.top_token_ids[:num_top])
            result.top_logprobs.extend(made_up.top_logprobs[:num_top])
        return result

    def _within_masks(self, samplers: list[SequenceState], tokens: list[int]) -> list[int]:
        """A constrained row's token is one its mask allows (EOS, when the grammar is
        complete, is all it allows), so constrained runs end as real ones do."""
        chosen = list(tokens)
        for row, seq in enumerate(samplers):
            mask = self.allowed_tokens.get(seq.seq_id)
            if mask is None:
                continue
            ids = allowed_ids(mask)
            if len(ids) and chosen[row] not in ids:
                chosen[row] = int(ids[self.sampler.index_below(len(ids))])
        return chosen


def read_null_model(config: WorkerConfig) -> tuple[NullModel, NullVocabulary]:
    """The model's description and vocabulary from its config and tokenizer, no weights.
    A declared architecture's directory with a plain tokenizer is read without
    transformers (models/config_file.py, null_tokenizer.py); anything else through it."""
    path = Path(config.model)
    if path.is_file() and path.suffix == ".gguf":
        source, extra = str(path.parent), {"gguf_file": path.name}
    elif path.is_dir() and (path / "config.json").is_file():
        source, extra = str(path), {}
    else:
        raise ValueError(f"cannot describe model {path}: not a .gguf file or a directory")
    declared = read_declared_config(path)
    text_config = declared[0] if declared else None
    tokenizer = read_tokenizer_files(path)
    if text_config is None or tokenizer is None:
        from transformers import AutoConfig, AutoTokenizer

        if text_config is None:
            text_config = AutoConfig.from_pretrained(
                source, local_files_only=True, **extra
            ).get_text_config()
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **extra)
    _, num_kv_heads, head_dim = attention_dims(text_config)
    model = NullModel(
        name=path.name,
        vocab_size=text_config.vocab_size,
        max_model_len=text_config.max_position_embeddings,
        num_layers=text_config.num_hidden_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
    )
    vocabulary = NullVocabulary(
        token_ids=ordinary_token_ids(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        eos_probability=config.null_eos_probability,
    )
    return model, vocabulary


def build_null_worker(config: WorkerConfig):
    """The startup.Worker of --model-impl null."""
    from worker_svc.compute.cpu_features import cpu_name
    from worker_svc.startup import Worker, pool_blocks

    model, vocabulary = read_null_model(config)
    # The float32 paths' pool dtype (unless --kv-cache-dtype says otherwise), so that
    # --kv-cache-memory gives the same block count as a float32 worker's.
    spec = KVPoolSpec(
        num_layers=model.num_layers,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        block_size=config.block_size,
        dtype=kv_cache_dtype(config.kv_cache_dtype, torch.float32),
    )
    pool = NullKVPool(spec, pool_blocks(config, spec))
    step_time = StepTimeModel(config.null_step_ms, config.null_step_us_per_token)
    runner = NullRunner(model, pool, NullSampler(vocabulary), step_time)
    description = worker_pb2.WorkerDescription(
        model_name=model.name,
        dtype=model.compute_path,
        device="none",
        num_kv_blocks=pool.num_blocks,
        block_size=config.block_size,
        max_model_len=model.max_model_len,
        vocab_size=model.vocab_size,
        attention_backend="none",
        instance_id=uuid.uuid4().hex,
        model_impl=model.model_impl,
        processor=cpu_name(),
    )
    # One thread: the server's forward thread, which only sleeps here.
    return Worker(runner, description, threads=1)
