"""llama.cpp's own GGUF converter (`convert_hf_to_gguf.py`), from the llama-cpp-python
sdist at the version `make bench-peers` builds (it vendors llama.cpp's source), so that
the GGUF files the tests and benchmarks read are written by the tool people use.

Only the converter's Python is unpacked (the script, its `conversion/` package and the
vendored `gguf-py`), into the peers' cache beside the built binaries; nothing is built.
The download (~75 MB, from PyPI) happens once per version.

    python -m bench.peers.converter HF_DIR OUT.gguf [--outtype f32|f16|bf16|q8_0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.peers.llama_server import LLAMA_CPP_PYTHON_VERSION, cache_dir

_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter_dir() -> Path:
    """The unpacked converter, downloaded and unpacked on first use."""
    target = cache_dir() / "converter"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
            + ["--dest", work],
            check=True,
        )
        sdist = Path(work) / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        staging = Path(work) / "converter"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                inner = member.name.removeprefix(prefix)
                if member.name.startswith(prefix) and inner.startswith(_PARTS) and member.isfile():
                    member.name = inner
                    archive.extract(member, staging, filter="data")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(target)  # whole or not at all
    return target


def convert(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """`model_dir` (a Hugging Face checkpoint) written as GGUF to `out` by llama.cpp."""
    script = converter_dir() / "convert_hf_to_gguf.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(script), str(model_dir), "--outtype", outtype, "--outfile", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.converter")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--outtype", default="f32", choices=("f32", "f16", "bf16", "q8_0"))
    args = parser.parse_args()
    print(convert(args.model_dir, args.out, args.outtype))


if __name__ == "__main__":
    main()
