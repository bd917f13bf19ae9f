"""What the accuracy gate measures on a loaded model, in this process (no service):
perplexity over token sequences, and greedy replies, through the worker's own runner.

Perplexity runs the model's forward over each whole text as one prefill, with logits
for every row, and scores each next token: exp(mean negative log-likelihood) over all
texts' predicted tokens. token_nlls can also score only the later part of a sequence,
as llama-perplexity scores its chunks (bench/accuracy/chunks.py). Greedy replies go
through ModelRunner with one step plan for all questions' prefills and one decode step
each after, as a worker serves them.
"""

from __future__ import annotations

import math

import torch

from cbserve.worker.v1 import worker_pb2 as pb
from worker_svc.attention import BatchLayout, PagedAttentionContext, select_backend
from worker_svc.kv_pool import KVPool, KVPoolSpec
from worker_svc.model_loader import LoadedModel
from worker_svc.model_runner import ModelRunner
from worker_svc.sampler import Sampler

BLOCK_SIZE = 16


def _pool(loaded: LoadedModel, blocks: int, kv_dtype: torch.dtype | None) -> KVPool:
    spec = KVPoolSpec(
        num_layers=loaded.num_layers,
        num_kv_heads=loaded.num_kv_heads,
        head_dim=loaded.head_dim,
        block_size=BLOCK_SIZE,
        dtype=kv_dtype or loaded.dtype,
    )
    return KVPool(spec, blocks)


def _backend(loaded: LoadedModel, kv_dtype: torch.dtype | None):
    backend, _ = select_backend(
        "auto", loaded.device, loaded.dtype, BLOCK_SIZE, loaded.head_dim, kv_dtype
    )
    return backend


@torch.inference_mode()
def token_nlls(
    loaded: LoadedModel, ids: list[int], score_from: int = 0, kv_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """-log p(ids[i + 1] | ids[:i + 1]) for i in score_from .. len(ids) - 2 (float64):
    the whole sequence is one prefill; logits are computed only for the rows scored.
    `kv_dtype` is the pool's (the worker's --kv-cache-dtype; default the model's): the
    prefill attends to its K/V as that pool stores them (attention/torch_backend.py)."""
    t = len(ids)
    blocks = -(-t // BLOCK_SIZE)
    backend = _backend(loaded, kv_dtype)
    layout = BatchLayout((t,), (t,), (tuple(range(blocks)),), BLOCK_SIZE)
    context = PagedAttentionContext(
        backend, _pool(loaded, blocks, kv_dtype), backend.build_metadata(layout, loaded.device)
    )
    tokens = torch.tensor(ids, device=loaded.device)
    rows = torch.arange(t, device=loaded.device)
    logits = loaded.model(tokens, rows, context, rows[score_from:-1]).float()
    logprobs = torch.log_softmax(logits, dim=-1)
    picked = logprobs.gather(1, tokens[score_from + 1 :, None])
    return -picked.squeeze(1).double()


def text_nll(
    loaded: LoadedModel, ids: list[int], kv_dtype: torch.dtype | None = None
) -> tuple[float, int]:
    """(sum of -log p(token | text before it), tokens scored) for one text."""
    nlls = token_nlls(loaded, ids, kv_dtype=kv_dtype)
    return float(nlls.sum()), len(ids) - 1


def perplexity(
    loaded: LoadedModel, texts: list[list[int]], kv_dtype: torch.dtype | None = None
) -> float:
    total, count = 0.0, 0
    for ids in texts:
        nll, n = text_nll(loaded, ids, kv_dtype)
        total += nll
        count += n
    return math.exp(total / count)


def chunk_nlls(
    loaded: LoadedModel,
    chunks: list[list[int]],
    score_from: int,
    kv_dtype: torch.dtype | None = None,
) -> list[float]:
    """Every chunk's scored tokens' NLLs, each chunk a fresh prefill (llama-perplexity's
    scoring: bench/accuracy/chunks.py)."""
    return [x for chunk in chunks for x in token_nlls(loaded, chunk, score_from, kv_dtype).tolist()]


def greedy_replies(
    loaded: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int,
    kv_dtype: torch.dtype | None = None,
) -> list[list[int]]:
    """Each prompt's greedy continuation, all prompts batched as the scheduler would."""
    per_seq = -(-(max(map(len, prompts)) + max_tokens) // BLOCK_SIZE)
    pool = _pool(loaded, per_seq * len(prompts), kv_dtype)
    runner = ModelRunner(loaded, pool, _backend(loaded, kv_dtype), Sampler(seed=0))
    first, decode = greedy_batch_plans(prompts, per_seq)
    replies: list[list[int]] = [[] for _ in prompts]
    for step in range(max_tokens):
        result = runner.execute(first if step == 0 else decode)
        for index, sid in enumerate(result.seq_ids):
            replies[sid].append(result.token_ids[index])
    return replies


def greedy_batch_plans(
    prompts: list[list[int]], blocks_per_seq: int, num_logprobs: int = 0
) -> tuple[pb.StepPlan, pb.StepPlan]:
    """The two plans that run all prompts greedily in one batch: a prefill step for all
    (each sequence with its own run of blocks_per_seq blocks), then a decode step for
    each, sent again for every further token (the runner keeps the state)."""
    sampling = pb.SequenceSampling(
        temperature=0.0, top_p=1.0, repetition_penalty=1.0, num_logprobs=num_logprobs
    )
    first = pb.StepPlan(step_id=0)
    for sid, prompt in enumerate(prompts):
        first.new_sequences.append(
            pb.NewSequence(
                seq_id=sid,
                prompt_token_ids=prompt,
                num_scheduled_tokens=len(prompt),
                block_ids=range(sid * blocks_per_seq, (sid + 1) * blocks_per_seq),
                sampling=sampling,
            )
        )
    decode = pb.StepPlan(
        continuing_sequences=[
            pb.ContinuingSequence(seq_id=sid, num_scheduled_tokens=1) for sid in range(len(prompts))
        ]
    )
    return first, decode
