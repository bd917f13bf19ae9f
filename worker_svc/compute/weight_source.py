"""What a model's weights are stored as, read from file headers before anything is
loaded: which block formats the block paths (`q4_1`, `bfloat16-weights`) would run, so
that `--dtype auto` times each candidate on the formats it would really get
(compute/path_timing.py) and offers `bfloat16-weights` only where it is exact.

- a `.gguf` file, or a float32 directory beside the GGUF it may have been converted
  from (models/qblock/build.py candidate_gguf): the GGUF's own blocks (timed as the
  shipped model's Q4_1 projections and Q8_0 head) on both block paths;
- any other float directory: `q4_1` quantizes it to Q8_0 at load; `bfloat16-weights`
  keeps it as BF16 rows, offered where the checkpoint is stored in bfloat16 (what a
  Hugging Face directory holds): then BF16 is the checkpoint's very weights.

What the accuracy gate (bench/accuracy/gate.py) measured decides what `auto` may take
(bench/RESULTS.md, Zen 4, SmolLM2-135M): Q8_0 made at load fails its reply gate (10/16
replies equal float32's from the bfloat16 checkpoint, 11/16 from the float32 one;
perplexity 1.0018x and 1.0016x), so `q4_1` is offered only where it runs a GGUF's own
blocks; the bfloat16 checkpoint's BF16 rows pass (16/16, perplexity 1.0000x). Both stay
one flag away (`--dtype q4_1`, `--dtype bfloat16-weights`) on any float checkpoint.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from worker_svc.compute.model_shapes import read_projection_shapes

BLOCK_PATHS = ("q4_1", "bfloat16-weights")


@dataclass(frozen=True)
class WeightSource:
    gguf_blocks: bool  # the block paths would run a GGUF's own blocks
    stored_dtype: str | None  # a directory's projections' safetensors dtype ("BF16", "F32")

    def offers(self, path: str) -> bool:
        """Whether `--dtype auto` may take `path` for these weights (what passed the
        accuracy gate: the module's docstring)."""
        if path == "q4_1":
            return self.gguf_blocks
        if path == "bfloat16-weights":
            return not self.gguf_blocks and self.stored_dtype == "BF16"
        return True

    def block_formats(self, path: str) -> tuple[str, str]:
        """(projections, LM head) formats a block path would run, by FORMATS name."""
        if self.gguf_blocks:
            return "Q4_1", "Q8_0"
        return ("BF16", "BF16") if path == "bfloat16-weights" else ("Q8_0", "Q8_0")


def read_weight_source(model_path: str | Path | None) -> WeightSource | None:
    """The model's WeightSource, or None where its files cannot be read cheaply."""
    if model_path is None:
        return None
    path = Path(model_path)
    if path.suffix == ".gguf":
        return WeightSource(gguf_blocks=True, stored_dtype=None)
    try:
        stored = projection_dtype(path)
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        return None
    if stored is None:
        return None
    from worker_svc.models.qblock.build import candidate_gguf

    beside = candidate_gguf(path)
    # A converted directory is float32 (its blocks dequantized) and has the GGUF's
    # shapes; only then can a GGUF's blocks equal its weights, which the load checks bit
    # for bit (models/qblock/gguf_blocks.py blocks_match_state).
    gguf = (
        stored == "F32"
        and beside is not None
        and beside.is_file()
        and read_projection_shapes(beside) == read_projection_shapes(path)
    )
    return WeightSource(gguf_blocks=gguf, stored_dtype=stored)


def projection_dtype(directory: Path) -> str | None:
    """The safetensors dtype of the directory's first 2-D `*_proj.weight` tensor."""
    for file in sorted(directory.glob("*.safetensors")):
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        for name, entry in header.items():
            if name.endswith("_proj.weight") and len(entry["shape"]) == 2:
                return str(entry["dtype"])
    return None
