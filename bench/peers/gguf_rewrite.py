"""A GGUF copied with some of its tensors rewritten: the metadata as it is, each tensor
either kept byte for byte or replaced by what the caller makes of it. The test files
(another block format for some tensors of a file llama.cpp made) and the benchmark's
twins (the same values in another format) are all made this way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

# What a rewrite makes of one tensor: its new rows and their GGML type, or None to keep it.
Rewrite = Callable[[gguf.ReaderTensor], "tuple[np.ndarray, gguf.GGMLQuantizationType] | None"]


def rewrite_gguf_tensors(source: Path, target: Path, rewrite: Rewrite) -> None:
    """`source` written to `target` with each tensor that `rewrite` returns rows for
    replaced by them (written through a partial file, so a crash leaves no half file)."""
    reader = gguf.GGUFReader(str(source))
    partial = target.with_name(target.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        # The writer adds the architecture and its own GGUF.* header fields itself.
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        replaced = rewrite(tensor)
        if replaced is None:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
        else:
            rows, qtype = replaced
            writer.add_tensor(tensor.name, rows, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(target)
