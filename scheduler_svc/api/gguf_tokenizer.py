"""A GGUF file's tokenizer and chat template, for a scheduler given `--tokenizer FILE.gguf`
(or `cbserve serve --model FILE.gguf`): the file carries them in its metadata, and no
tokenizer files need sit beside it.

The scheduler reads a Hugging Face tokenizer directory (api/tokenizer.py). Where tokenizer
files lie beside the GGUF, that directory is used. Otherwise transformers turns the
GGUF's vocabulary, merges, special tokens and template into such a directory once, in a
child process (transformers is not imported by the scheduler: it would pull in torch),
cached under `~/.cache/cbserve/gguf-tokenizers/` (`$CBSERVE_GGUF_TOKENIZER_CACHE` moves
it) by the file's name, size and modification time. The EOS id of the GGUF
(`tokenizer.ggml.eos_token_id`) goes into the directory's generation_config.json, as a
stop token.

    python -m scheduler_svc.api.gguf_tokenizer FILE.gguf OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE_ENV = "CBSERVE_GGUF_TOKENIZER_CACHE"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return (
        Path(configured) if configured else Path.home() / ".cache" / "cbserve" / "gguf-tokenizers"
    )


def tokenizer_dir(gguf: Path) -> Path:
    """A directory holding the GGUF's tokenizer as the scheduler reads one."""
    if (gguf.parent / "tokenizer.json").is_file():
        return gguf.parent
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = cache_root() / f"{gguf.stem}-{key.hexdigest()[:16]}"
    if (target / "tokenizer.json").is_file():
        return target
    staging = target.with_name(target.name + f".partial-{os.getpid()}")
    result = subprocess.run(
        [sys.executable, "-m", __name__, str(gguf), str(staging)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise FileNotFoundError(
            f"cannot read the tokenizer of {gguf}: {result.stderr.strip().splitlines()[-1:]}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.replace(target)  # whole or not at all
    except OSError:  # a concurrent start wrote it first: its copy is the same
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write(gguf: Path, out: Path) -> None:
    """In the child: transformers reads the GGUF's tokenizer and writes its files."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, local_files_only=True
    )
    tokenizer.save_pretrained(str(out))
    eos = tokenizer.eos_token_id
    if eos is not None:
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))


if __name__ == "__main__":
    _write(Path(sys.argv[1]), Path(sys.argv[2]))
