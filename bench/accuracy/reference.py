"""Which float32 model a GGUF file is scored against (`cbserve bench accuracy --model
FILE.gguf [--reference DIR_OR_FILE]`).

A quantized file's greedy replies are compared with float32's, so the float32 model must
be the one the file was made from. Given --reference, that model is taken when its
projection shapes and vocabulary size are the file's (a mismatch is refused: the
comparison would be meaningless). Without it, the file is taken for a requantization of
the default model when it has the shipped GGUF's architecture, the same tensors of the
same shapes (names as llama.cpp writes them; the block types may differ) and the same
vocabulary, token by token; its reference is then the default model's float directory
(`make model` converts the shipped file into it). Anything else needs --reference.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from worker_svc.compute.model_shapes import read_projection_shapes


class ReferenceError(ValueError):
    """No float32 reference can be used for the file; the message says what to pass."""


@dataclass(frozen=True)
class GgufIdentity:
    """What a requantization keeps of its source: the architecture, every tensor's name
    and shape (not its block type), and the vocabulary."""

    architecture: str
    tensor_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    vocabulary_sha256: str


def gguf_identity(path: Path) -> GgufIdentity:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = reader.fields["general.architecture"]
    architecture = bytes(arch.parts[arch.data[0]]).decode()
    shapes = tuple(sorted((t.name, tuple(int(n) for n in t.shape)) for t in reader.tensors))
    digest = hashlib.sha256()
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        for index in tokens.data:
            digest.update(bytes(tokens.parts[index]) + b"\0")
    return GgufIdentity(architecture, shapes, digest.hexdigest())


def default_model_reference() -> Path | None:
    """The default model's float32: its converted directory, else the shipped file
    (the same weights, dequantized at load)."""
    from common.defaults import converted_model_dir, packaged_gguf_path

    converted = converted_model_dir()
    return converted if (converted / "config.json").is_file() else packaged_gguf_path()


def is_default_model(gguf: Path, shipped: Path | None) -> bool:
    """Whether `gguf` is the shipped file or a requantization of it."""
    if shipped is None:
        return False
    if gguf.resolve() == shipped.resolve():
        return True
    return gguf_identity(gguf) == gguf_identity(shipped)


def resolve_reference(gguf: Path, given: Path | None, shipped: Path | None) -> Path:
    """The float32 model that `gguf` is compared with. Raises ReferenceError."""
    if given is not None:
        ours, theirs = read_projection_shapes(gguf), read_projection_shapes(given)
        if ours is None or theirs is None:
            unread = gguf if ours is None else given
            raise ReferenceError(f"cannot read the shapes of {unread}")
        if ours != theirs:
            raise ReferenceError(
                f"--reference {given} is not the model of {gguf.name}: "
                f"{theirs.describe()} against the file's {ours.describe()}"
            )
        return given
    if is_default_model(gguf, shipped):
        reference = default_model_reference()
        if reference is not None:
            return reference
    raise ReferenceError(
        f"{gguf.name} is not the default model requantized (architecture, tensor shapes "
        "or vocabulary differ): pass --reference DIR_OR_FILE, the float32 model it was "
        "made from"
    )
