"""The small-M tiles fetch their weights ahead (kernels/qblock_prefetch.h).

The lookahead changes no result, so no product test sees it go; and it went once
without a sound: written as an inline function, GCC 12 compiled it into two of these
tiles as nothing at all, and the decode step ran slower than with no lookahead. This
reads the built library's instructions instead (objdump, from the binutils that the C
compiler needs).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from worker_svc.compute.qblock import load_qblock_kernel, supported_variants

# Each small tile, by the variant whose code it is.
TILES = {
    "avx2": ("kq_small_tile_avx2", "f16_small_tile_avx2"),
    "avx512": ("q4q8_small_tile_avx512", "kq_small_tile_avx512", "f16_small_tile_avx512"),
}


def prefetches_in(library: str, symbol: str) -> int:
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--disassemble={symbol}", library],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert f"<{symbol}>:" in listing, f"{symbol} is not in {library}"
    return listing.count("prefetcht1")


# objdump is what reads the instructions: a process, so this runs in `make test`, not
# the fast tier (tests/tiers.py).
@pytest.mark.process
@pytest.mark.parametrize("variant", sorted(TILES))
def test_every_small_tile_fetches_its_weights_ahead(variant):
    if variant not in supported_variants():
        pytest.skip(f"this CPU does not run the {variant} variant")
    assert shutil.which("objdump"), "objdump (binutils) is needed to read the kernel"
    library = load_qblock_kernel()._name
    missing = [symbol for symbol in TILES[variant] if prefetches_in(library, symbol) == 0]
    assert not missing, f"no prefetcht1 in {missing}: the lookahead was compiled away"
