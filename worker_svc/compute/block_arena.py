"""Every block weight of a model in one buffer on huge pages, in the order a step reads.

A one-stream decode step reads every projection's blocks once, from memory (about
105 MB a token for SmolLM2's GGUF files, more than the L3). The blocks were a few
hundred separate allocations of under 2 MiB each, on 4 KiB pages: the weight stream
took a TLB miss and a page walk every 4 KiB, and a tensor's last lookahead
(kernels/qblock_prefetch.h, 16 KB on) fetched lines of whatever memory came next.
Gathered here into one buffer, advised to 2 MiB pages before it is written
(huge_pages.py), and laid out layer by layer in the step's order, the stream crosses a
page boundary every 2 MiB and its lookahead runs into the next weight it reads.
`python -m bench.micro.weight_stream --pages 4k,huge` times the kernels both ways
(README, "Weights on huge pages").

The buffer's bytes are the blocks' bytes: nothing any kernel computes changes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from worker_svc.compute.qblock_linear import QBlockLinear
from worker_svc.compute.qblock_stack import QBlockStack, block_runs
from worker_svc.huge_pages import HUGE_PAGE_BYTES, advise_huge_pages

# Each run starts on a cache line: the kernels' vector loads assume no more, and a
# line of its own keeps one run's lookahead from splitting lines with the next.
RUN_ALIGNMENT = 64


def gather_block_weights(projections: Iterable[object]) -> tuple[torch.Tensor | None, bool]:
    """Moves the blocks of every QBlockLinear run of `projections` (in that order) into
    one new buffer; returns it and whether the kernel took the huge page advice. The
    modules' `blocks` become views of it; their old storage is freed with them."""
    blocks = [p for p in projections if isinstance(p, QBlockLinear | QBlockStack)]
    runs = [run for p in blocks for run in block_runs(p)]
    if not runs:
        return None, False
    # Each run's bytes rounded up to whole lines: the space it takes in the buffer.
    spans = [-(-run.blocks.numel() // RUN_ALIGNMENT) * RUN_ALIGNMENT for run in runs]
    # One huge page of slack: the runs start at the first 2 MiB boundary, so that all
    # of them lie in the advised, aligned interior.
    arena = torch.empty(sum(spans) + HUGE_PAGE_BYTES, dtype=torch.uint8)
    huge = advise_huge_pages(arena)
    offset = -arena.data_ptr() % HUGE_PAGE_BYTES
    for run, span in zip(runs, spans, strict=True):
        view = arena[offset : offset + run.blocks.numel()].view(run.blocks.shape)
        view.copy_(run.blocks)
        run.blocks = view
        offset += span
    return arena, huge
