"""Generates the gRPC code while the package builds, so that `pip install .` or
`pip install git+URL` from a clean clone gives a working `from cbserve import Client`
without `make proto` (the generated modules are git-ignored).

Everything else about the package is declared in pyproject.toml; grpcio-tools, which
runs protoc here, is one of its [build-system] requirements.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROJECT_ROOT = Path(__file__).resolve().parent
PROTO_ROOT = PROJECT_ROOT / "proto"
# The packages the generated modules land in, as `proto/` lays them out.
PROTO_PACKAGES = ("cbserve/v1", "cbserve/worker/v1")


def generate_grpc_code(out_dir: Path) -> list[Path]:
    """Runs protoc on proto/ into out_dir (a build directory, or the source tree for an
    editable install); returns the files it wrote."""
    from grpc_tools import protoc

    protos = sorted(
        str(path) for pkg in PROTO_PACKAGES for path in (PROTO_ROOT / pkg).glob("*.proto")
    )
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}: cannot build the gRPC code")
    # `python -m grpc_tools.protoc` adds the well-known types' include path itself; main()
    # called directly does not.
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    out = str(out_dir)
    argv = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *protos,
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    written = []
    for pkg in PROTO_PACKAGES:
        written += sorted((out_dir / pkg).glob("*_pb2*.py*"))
    return written


class BuildPyWithGrpc(build_py):
    """build_py, then protoc: into the build directory for a wheel, into the source
    tree for an editable install (whose packages are imported from there)."""

    def run(self) -> None:
        super().run()
        editable = getattr(self, "editable_mode", False)
        out_dir = PROJECT_ROOT if editable else Path(self.build_lib)
        for path in generate_grpc_code(out_dir):
            self.announce(f"generated {path}", level=2)


setup(cmdclass={"build_py": BuildPyWithGrpc})
