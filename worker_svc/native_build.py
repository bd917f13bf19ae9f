"""Builds the worker's own C kernels on the machine that runs them, once, and loads them.

A kernel is compiled by the system's C compiler (`$CC`, else gcc or cc) at its first
use: about a second. The shared object is cached under `$CBSERVE_KERNEL_CACHE` (default
`~/.cache/cbserve/kernels`), named by a hash of the source, the flags, the compiler and
the CPU's feature flags, so that a cache shared between machines never hands one CPU
another's `-march=native` build. Libraries are loaded with ctypes after torch, so their
OpenMP calls bind to the libgomp torch already loaded and share its threads.

Where no compiler is found or the build fails, KernelUnavailableError says why, and
the caller keeps its torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  (loaded first: the kernels must bind to torch's libgomp)


class KernelUnavailableError(RuntimeError):
    """A kernel cannot be built or loaded here; the message says why."""


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cpu_flags_line() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def cache_dir() -> Path:
    configured = os.environ.get("CBSERVE_KERNEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "cbserve" / "kernels"


def _build(cc: str, parts: tuple, link: tuple, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        objects = [
            str(Path(scratch) / f"{i}-{source.stem}.o") for i, (source, _) in enumerate(parts)
        ]
        lib = Path(scratch) / target.name
        steps = [
            [cc, *flags, "-c", str(source), "-o", obj]
            for (source, flags), obj in zip(parts, objects, strict=True)
        ]
        for argv in (*steps, [cc, *objects, *link, "-o", str(lib)]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise KernelUnavailableError(
                    f"building {target.stem} failed ({' '.join(argv[:2])} ...): "
                    f"{done.stderr.strip()[-500:]}"
                )
        os.replace(lib, target)  # atomic: workers starting together never load half a file


def build_and_load(source: Path, compile_flags: tuple, link_flags: tuple) -> ctypes.CDLL:
    """The compiled library for `source`, built on first use. Callers cache the result
    (functools.cache) and declare the argument types of the functions they call."""
    return build_and_load_parts(source.stem, ((source, compile_flags),), link_flags)


def build_and_load_parts(name: str, parts: tuple, link_flags: tuple) -> ctypes.CDLL:
    """One library from several sources, each `(path, compile_flags)` compiled with its
    own flags (a kernel that needs -ffast-math beside one that must not have it), then
    linked together. The headers beside each source count in the cache key."""
    cc = compiler()
    if cc is None:
        raise KernelUnavailableError(f"no C compiler (gcc, cc or $CC) to build {name}")
    key = hashlib.sha256()
    for source, flags in parts:
        key.update(source.read_bytes())
        for header in sorted(source.parent.glob("*.h")):
            key.update(header.read_bytes())
        key.update(" ".join(flags).encode())
    key.update(" ".join(link_flags).encode())
    key.update(cc.encode())
    key.update(cpu_flags_line().encode())
    target = cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            _build(cc, parts, link_flags, target)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelUnavailableError(f"building {name} failed: {exc}") from exc
    try:
        return ctypes.CDLL(str(target))
    except OSError as exc:
        raise KernelUnavailableError(f"loading {target} failed: {exc}") from exc
