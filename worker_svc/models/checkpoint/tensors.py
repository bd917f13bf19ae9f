"""A checkpoint's tensors under transformers' names, each read from its file only when
asked for, into memory of its own (checkpoint.weights reads them all at once).

For a path that keeps few float32 weights (`--dtype q4_1`): it reads the embedding and
the norms, and compares the projections with the GGUF's blocks one tensor at a time,
so the float32 projections are never all in memory together. Reads go through the
file (`np.fromfile`), not a memory map: a mapped page counts in the worker's resident
memory for as long as the map lives, the page cache does not.

Safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the data. GGUF: located by checkpoint.gguf_index,
dequantized by the `gguf` package, q/k reordered as checkpoint.weights does.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from worker_svc.models.checkpoint.gguf_index import GgufIndex, read_index
from worker_svc.models.checkpoint.weights import (
    gguf_to_hf_names,
    hf_name,
    qk_heads,
    undo_rope_permute,
)
from worker_svc.models.declaration import Architecture

# Safetensors dtype names -> (numpy dtype to read, torch dtype to view as).
_SAFETENSORS_DTYPES = {
    "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16),
    "BF16": (np.int16, torch.bfloat16),
}


@dataclass(frozen=True)
class _Located:
    file: Path
    offset: int
    shape: tuple[int, ...]  # outermost first, as torch has it
    kind: str  # safetensors dtype name, or "gguf:<ggml type id>"
    count: int  # elements (safetensors) or bytes (GGUF)


class CheckpointTensors(Mapping[str, torch.Tensor]):
    """name -> float tensor, read on each access (callers keep what they need)."""

    def __init__(
        self, checkpoint: Path, architecture: Architecture, num_heads: int, num_kv_heads: int
    ):
        self._heads: dict[str, int] = {}  # name -> heads to un-permute by (llama's GGUF q/k)
        if checkpoint.suffix == ".gguf":
            self._located, roles = _locate_gguf(read_index(checkpoint), architecture)
            for name, role in roles.items():
                heads = qk_heads(architecture, role, num_heads, num_kv_heads)
                if heads:
                    self._heads[name] = heads
        else:
            files = sorted(checkpoint.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {checkpoint}")
            self._located = {}
            for file in files:
                self._located.update(_locate_safetensors(file))

    def shape(self, name: str) -> tuple[int, ...]:
        return self._located[name].shape

    def stored_dtype(self) -> str:
        """The projections' stored type: a safetensors dtype name ("BF16", "F32"), or
        "gguf:<ggml type id>"."""
        kinds = [w.kind for n, w in self._located.items() if n.endswith("_proj.weight")]
        return kinds[0] if kinds else "unknown"

    def __getitem__(self, name: str) -> torch.Tensor:
        where = self._located[name]
        if where.kind.startswith("gguf:"):
            return self._read_gguf(name, where)
        np_dtype, torch_dtype = _SAFETENSORS_DTYPES[where.kind]
        values = np.fromfile(where.file, np_dtype, where.count, offset=where.offset)
        return torch.from_numpy(values).view(torch_dtype).reshape(where.shape)

    def __contains__(self, name: object) -> bool:
        # Mapping's own would read the tensor to answer.
        return name in self._located

    def __iter__(self) -> Iterator[str]:
        return iter(self._located)

    def __len__(self) -> int:
        return len(self._located)

    def _read_gguf(self, name: str, where: _Located) -> torch.Tensor:
        import gguf

        kind = gguf.GGMLQuantizationType(int(where.kind.removeprefix("gguf:")))
        raw = np.fromfile(where.file, np.uint8, where.count, offset=where.offset)
        rows = int(np.prod(where.shape[:-1]))
        values = gguf.quants.dequantize(raw.reshape(rows, -1), kind)
        weight = torch.from_numpy(np.asarray(values, dtype=np.float32).reshape(where.shape))
        if name in self._heads:
            weight = undo_rope_permute(weight, self._heads[name])
        return weight


def _locate_safetensors(file: Path) -> dict[str, _Located]:
    with open(file, "rb") as handle:
        (header_bytes,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_bytes))
    data_start = 8 + header_bytes
    located = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{file}: {name} is {entry['dtype']}, not a float type read here")
        begin, end = entry["data_offsets"]
        count = (end - begin) // np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]][0]).itemsize
        located[name] = _Located(
            file, data_start + begin, tuple(entry["shape"]), entry["dtype"], count
        )
    return located


def _locate_gguf(
    index: GgufIndex, architecture: Architecture
) -> tuple[dict[str, _Located], dict[str, str]]:
    """Where each tensor lies, under transformers' names, and each name's role."""
    import gguf

    table = gguf_to_hf_names(architecture)
    located, roles = {}, {}
    for info in index.tensors.values():
        named = hf_name(info.name, table)
        if named is None:
            continue
        name, roles[name] = named
        block, size = gguf.constants.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.ggml_type)]
        elements = int(np.prod(info.shape))
        shape = tuple(int(d) for d in reversed(info.shape))  # GGUF lists innermost first
        located[name] = _Located(
            index.path, info.offset, shape, f"gguf:{info.ggml_type}", elements // block * size
        )
    return located, roles
