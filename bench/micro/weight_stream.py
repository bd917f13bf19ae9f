"""How fast the decode's block kernel reads weights from memory, against how fast this
machine reads memory at all.

    .venv/bin/python -m bench.micro.weight_stream [--formats Q8_0,Q4_1,Q5_0,Q4_K,Q6_K]
        [--threads 2] [--rows 1,2] [--in-memory-mb 160] [--repeats 20] [--variant auto]
        [--pages 4k|huge|4k,huge]

A decode step at one stream multiplies one row of activations by every weight of the
model: for the default model about 105 MB a token, more than a server's L3 holds, so
the step runs at the speed the kernel streams its weights from memory. Per format this
times the block kernel (`qblock_matmul`, the tiles the native step runs at small M) at
M = --rows on a weight of 2 MB (in cache) and of --in-memory-mb (from memory), and
prints GB/s of block bytes; the first line is the ceiling: the same threads summing a
float32 tensor of the big size. The kernel's lookahead (kernels/qblock_prefetch.h) was
chosen from this: the tiles reached 14.5 GB/s on a Q8_0 weight on 2 Zen 4 threads when
they fetched one tile ahead, beside a ceiling of 31. Weights are random blocks (the
arithmetic does not depend on the values); medians of --repeats calls, after warm-up.

--pages says what memory holds the weight: 4 KiB pages (a plain allocation) or 2 MiB
ones (advised before the first write, as compute/block_arena.py holds a model's
weights); with both, each row is timed on each, the ceiling too.
"""

from __future__ import annotations

import argparse

import torch

from bench.micro.qblock import timed
from worker_svc.compute.cpu_features import cpu_name
from worker_svc.compute.qblock import FORMATS, qblock_matmul
from worker_svc.huge_pages import advise_huge_pages

# A K each format's blocks divide: SmolLM2's hidden size, or its MLP width for the
# super-blocks of 256.
K_BY_BLOCK = {32: 576, 256: 1536}


def on_pages(values: torch.Tensor, pages: str) -> torch.Tensor:
    """A copy of `values` in new memory of 4 KiB pages or, with "huge", of 2 MiB ones
    (where the kernel takes the advice)."""
    copy = torch.empty_like(values)
    if pages == "huge":
        advise_huge_pages(copy)
    return copy.copy_(values)


def memory_ceiling(megabytes: int, repeats: int, pages: str = "4k") -> float:
    """GB/s of a plain float32 sum over `megabytes`: what the threads can read."""
    data = on_pages(torch.ones(megabytes * 2**20 // 4), pages)
    return data.numel() * 4 / timed(data.sum, repeats)[1] / 1e9


def stream_row(
    fmt_name: str, m: int, megabytes: int, repeats: int, variant: str, pages: str = "4k"
) -> tuple[float, float]:
    """(GB/s of block bytes, GFLOP/s) of the kernel at M = m on a `megabytes` weight."""
    fmt = FORMATS[fmt_name]
    k = K_BY_BLOCK[fmt.block_weights]
    row_bytes = fmt.row_bytes(k)
    n = megabytes * 2**20 // row_bytes // 16 * 16
    blocks = on_pages(torch.randint(0, 60, (n, row_bytes), dtype=torch.uint8), pages)
    x = torch.randn(m, k)
    _, seconds = timed(lambda: qblock_matmul(x, blocks, fmt, k, variant), repeats)
    return n * row_bytes / seconds / 1e9, 2 * m * n * k / seconds / 1e9


def main(argv: list[str] | None = None, prog: str = "python -m bench.micro.weight_stream") -> None:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--formats", default="Q8_0,Q4_1,Q5_0,Q4_K,Q6_K")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2", help="M values (rows of activations)")
    parser.add_argument("--in-memory-mb", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variant", default="auto", help="the kernel's: auto, avx2, avx512...")
    parser.add_argument("--pages", default="4k", help="4k, huge or 4k,huge: the weight's memory")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"CPU: {cpu_name()}, {args.threads} threads, kernel variant {args.variant}, "
        f"torch {torch.__version__}"
    )
    pages = args.pages.split(",")
    ceilings = {}
    for kind in pages:
        ceilings[kind] = memory_ceiling(args.in_memory_mb, args.repeats, kind)
        print(
            f"ceiling ({kind} pages): a float32 sum over {args.in_memory_mb} MB "
            f"reads {ceilings[kind]:.1f} GB/s"
        )
    header = ("format", "M", "pages", "in cache (2 MB)", "from memory", "of ceiling")
    print("{:7s} {:>3s} {:>5s} {:>22s} {:>24s} {:>11s}".format(*header))
    for fmt_name in args.formats.split(","):
        for m in (int(r) for r in args.rows.split(",")):
            for kind in pages:
                cached = stream_row(fmt_name, m, 2, args.repeats, args.variant, kind)
                streamed = stream_row(
                    fmt_name, m, args.in_memory_mb, args.repeats, args.variant, kind
                )
                print(
                    f"{fmt_name:7s} {m:3d} {kind:>5s} {cached[0]:7.1f} GB/s {cached[1]:6.1f} "
                    f"GFLOP/s {streamed[0]:7.1f} GB/s {streamed[1]:6.1f} GFLOP/s "
                    f"{streamed[0] / ceilings[kind]:10.0%}"
                )


if __name__ == "__main__":
    main()
