"""Attention with a sink logit per query head (gpt-oss), written out in float32.

gpt-oss learns one logit per head that joins every query's softmax as an extra
column and is then dropped: p_j = exp(s_j - m) / (sum_i exp(s_i - m) + exp(sink - m)),
m the maximum over the scores and the sink. Some of each query's weight goes to
"nothing", so its output is the usual one scaled down by Z / (Z + exp(sink)).

SDPA has no sink argument, and the exact tricks around it need either the softmax's
log-sum-exp (a private op per device) or a per-head float mask as large as the
scores. So a layer with sinks computes its scores explicitly, as transformers' eager
attention does, in query tiles that keep the score tensor under SCORE_BUDGET floats.
Only sink layers pay this; every other layer keeps SDPA.
"""

from __future__ import annotations

import torch

# Largest score tile a prefill chunk materializes at once (floats: 64 MiB).
SCORE_BUDGET = 16 * 1024 * 1024


def attend_with_sinks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """query `[B, kv_heads, G, L, d]` (the G query heads sharing a kv head, L query
    rows); key/value `[B, kv_heads, K, d]`; mask bool, broadcastable to
    `[B, kv_heads, G, L, K]`, True where a key is seen (every row sees one at least);
    sinks `[kv_heads * G]` -> `[B, kv_heads, G, L, d]` in the query's dtype.

    The query heads of a kv head share its keys through one matmul of G * L rows, so
    grouped-query attention copies no K/V."""
    b, kv_heads, group, rows, head_dim = query.shape
    q = query.float().reshape(b, kv_heads, group * rows, head_dim)
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale
    scores = scores.view(b, kv_heads, group, rows, -1).masked_fill(~mask, float("-inf"))
    sink = sinks.float().view(1, kv_heads, group, 1, 1).expand(b, -1, -1, rows, 1)
    # The sink's column joins the max and the sum, then leaves: transformers' eager math.
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs.reshape(b, kv_heads, group * rows, -1), value.float())
    return out.view(b, kv_heads, group, rows, head_dim).to(query.dtype)


def attend_chunk_with_sinks(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """A prefill chunk: query `[L, heads, d]`, key/value `[K, kv_heads, d]`, mask
    `[L, K]` -> `[L, heads, d]`, in query tiles of at most SCORE_BUDGET scores."""
    rows, num_heads, head_dim = query.shape
    kv_heads = key.shape[1]
    group = num_heads // kv_heads
    k = key.transpose(0, 1).unsqueeze(0)
    v = value.transpose(0, 1).unsqueeze(0)
    # [L, heads, d] -> [1, kv_heads, G, L, d]: query head h reads kv head h // G.
    q = query.permute(1, 0, 2).reshape(1, kv_heads, group, rows, head_dim)
    tile = max(1, SCORE_BUDGET // (num_heads * key.shape[0]))
    out = query.new_empty((rows, num_heads, head_dim))
    for start in range(0, rows, tile):
        part = slice(start, start + tile)
        o = attend_with_sinks(q[:, :, :, part], k, v, mask[part], scale, sinks)
        out[part] = o[0].reshape(num_heads, -1, head_dim).transpose(0, 1)
    return out
