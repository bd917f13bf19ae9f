"""The own forward compiled by torch.compile (Inductor): one graph for the whole step.

Eager, a decode step is ~500 small operator calls (norms, rotary, residual adds,
splits) around the projections, each paying Python and dispatcher time; Inductor
fuses the elementwise work into a few C++ loops and calls the rest from one
generated function.

The paged attention cannot be traced: each backend walks its per-step metadata in
Python (decode groups, prefill chunks) and the CPU one calls a C kernel through
ctypes. It enters the graph as one opaque custom op per layer, `cbserve::attention`,
which takes only tensors and the layer index; the step's real context (backend,
pool, metadata) is handed to it through `_STEP`, set around the compiled call, as
vLLM's forward context does. So there is no graph break and the graph does not
depend on the batch's layout, only on its sizes.

Sizes: the flat batch length T and the number of sampled rows S are marked
dynamic, so one graph serves every T >= 2; T = 1 (one stream decoding) and S = 1
(one sequence sampling) get graphs of their own, because torch.compile always
specializes sizes 0 and 1. `warm_up` compiles the three a step can need
((1, 1), (T, 1), (T, S)) before the worker reports ready, so no request waits for
a compile; Inductor caches the generated code on disk (`TORCHINDUCTOR_CACHE_DIR`),
so a restart on the same machine and torch mostly loads it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker_svc.attention import PagedAttentionContext
from worker_svc.attention.torch_backend import scratch_context

# The step whose forward is running: (attention context) or None outside a forward.
_STEP: list[PagedAttentionContext] = []


@torch.library.custom_op("cbserve::attention", mutates_args=())
def _attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer_idx: int,
    scale: float,
    window: int,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    # The K/V pool is written inside (not declared as mutated: the pool is not an
    # input of the graph); the layers' data dependence keeps the calls in order.
    context = _STEP[-1]
    return context.backend.forward(
        layer_idx,
        query,
        key,
        value,
        context.pool,
        context.metadata,
        scale,
        window or None,
        sinks=sinks,
    )


@_attention_op.register_fake
def _(query, key, value, layer_idx, scale, window, sinks=None):
    return query.new_empty(query.shape)


class _OpBackend:
    """What the traced layers see as their attention backend: the custom op."""

    name = "compiled"
    # Sinks pass through the op; whether the step's real backend takes them is
    # checked at load (AttentionBackend.supports_sinks).
    supports_sinks = True

    def forward(self, layer_idx, query, key, value, pool, metadata, scale, window=None, sinks=None):
        # 0 for no window: a custom op's int argument cannot be None.
        return torch.ops.cbserve.attention(query, key, value, layer_idx, scale, window or 0, sinks)


_TRACED_CONTEXT = PagedAttentionContext(_OpBackend(), None, None)  # type: ignore[arg-type]


class CompiledForward(torch.nn.Module):
    """Wraps a model called as model(input_ids, positions, attention, sample_rows)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        if getattr(model, "native_decode", None) is not None:
            # The graph is the Python forward's; a native step would bypass it.
            model.native_decode = None
            model.native_decode_status = "off: --compile traces the Python forward"
        self.model = model
        self._compiled: Callable = torch.compile(self._traced, dynamic=False)

    def _traced(self, input_ids, positions, sample_rows):
        return self.model(input_ids, positions, _TRACED_CONTEXT, sample_rows)

    def forward(self, input_ids, positions, attention, sample_rows):
        if attention.lora is not None and not attention.lora.is_empty:
            # The graph is traced without LoRA rows: a step with adapter rows runs the
            # eager forward, which adds their deltas (worker_svc/lora/delta.py).
            return self.model(input_ids, positions, attention, sample_rows)
        if input_ids.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(input_ids, 0)
            torch._dynamo.maybe_mark_dynamic(positions, 0)
        if sample_rows.shape[0] > 1:
            torch._dynamo.maybe_mark_dynamic(sample_rows, 0)
        _STEP.append(attention)
        try:
            return self._compiled(input_ids, positions, sample_rows)
        finally:
            _STEP.pop()

    @torch.inference_mode()
    def warm_up(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Compiles the graphs of the step shapes (1, 1), (2, 1) and (2, 2) (flat tokens,
        sampled rows), on a throwaway pool: the graphs do not depend on the attention
        backend, which is opaque to them."""
        device = self.model.embed_tokens.device
        num_layers = len(self.model.layers)
        for query_lens, sample_rows in (((1,), [0]), ((2,), [1]), ((1, 1), [0, 1])):
            t = sum(query_lens)
            self(
                torch.zeros(t, dtype=torch.long, device=device),
                torch.cat([torch.arange(q, device=device) for q in query_lens]),
                scratch_context(num_layers, num_kv_heads, head_dim, dtype, query_lens, device),
                torch.tensor(sample_rows, device=device),
            )
