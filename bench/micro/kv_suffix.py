"""A compute path's name with the KV pool's dtype after it, for the benchmarks that
compare paths side by side (bench/accuracy/gate.py, bench/micro/step_compare.py):

    q4_1          the q4_1 path, its pool in the compute dtype (--kv-cache-dtype auto)
    q4_1+kv16     the same with a float16 pool (--kv-cache-dtype float16)
    q4_1+kvbf16   ... bfloat16; `+kv32` float32

so that `--paths q4_1,q4_1+kv16` measures both in one run. Torch-free.
"""

from __future__ import annotations

KV_SUFFIXES = {"kv16": "float16", "kvbf16": "bfloat16", "kv32": "float32"}


def split_kv_suffix(name: str) -> tuple[str, str]:
    """`"q4_1+kv16"` -> `("q4_1", "float16")`; a name without a suffix -> `(name, "auto")`."""
    path, plus, suffix = name.partition("+")
    if not plus:
        return name, "auto"
    if suffix not in KV_SUFFIXES:
        known = ", ".join(f"+{s}" for s in KV_SUFFIXES)
        raise ValueError(f"unknown KV suffix in {name!r}: expected one of {known}")
    return path, KV_SUFFIXES[suffix]
