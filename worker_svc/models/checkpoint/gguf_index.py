"""Where each tensor of a GGUF file lies, and the few metadata numbers the block path
needs, read without decoding the rest of the metadata.

gguf's GGUFReader builds numpy views of every metadata value, the tokenizer's ~49k
strings included: about 7 s of a worker's start on 2 cores. The format is simple
enough to walk (GGUF v2/v3: header, key/value pairs, tensor infos, aligned data),
skipping values it does not need.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Metadata value types: fixed sizes; 8 is a string, 9 an array.
_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # innermost first, as GGUF lists it
    ggml_type: int
    offset: int  # from the start of the file


@dataclass(frozen=True)
class GgufIndex:
    path: Path
    metadata: dict[str, object]  # scalars and strings; arrays are skipped (None)
    tensors: dict[str, TensorInfo]

    def raw(self, info: TensorInfo, nbytes: int) -> np.ndarray:
        """The tensor's bytes, memory-mapped."""
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(nbytes,))


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0]

    def string(self) -> str:
        length = self.take("Q")
        self.pos += length
        return self.data[self.pos - length : self.pos].decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _SCALAR:
            return self.take(_SCALAR[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self.take("I"), self.take("Q")
        if item in _SCALAR:
            self.pos += count * struct.calcsize("<" + _SCALAR[item])
        else:
            for _ in range(count):
                self.value(item)
        return None


def read_index(path: str | Path) -> GgufIndex:
    path = Path(path)
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        # Metadata and tensor infos come first; 64 MB covers any vocabulary seen so far.
        cursor = _Cursor(handle.read(64 << 20))
    version = cursor.take("I")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    tensor_count, kv_count = cursor.take("Q"), cursor.take("Q")
    metadata: dict[str, object] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.take("I"))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = tuple(cursor.take("Q") for _ in range(cursor.take("I")))
        infos.append((name, dims, cursor.take("I"), cursor.take("Q")))
    alignment = int(metadata.get("general.alignment") or 32)
    start = 4 + cursor.pos
    start += -start % alignment
    tensors = {n: TensorInfo(n, d, t, start + offset) for n, d, t, offset in infos}
    return GgufIndex(path, metadata, tensors)
