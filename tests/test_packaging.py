"""`pip install .` from a clean clone builds the generated gRPC code (setup.py), so that
`from cbserve import Client` works without `make proto`.

Offline: the shared venv's pip builds the wheel without build isolation (setuptools and
grpcio-tools, the [build-system] requirements, are installed there already), from a
copy of the tree that has no generated modules, as a fresh clone has none.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO_ROOT = Path(__file__).resolve().parent.parent
# What a clone holds that the build reads (tests, examples and deploy are not packaged).
BUILD_INPUTS = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md"]
SOURCE_DIRS = ["proto", "cbserve", "scheduler_svc", "worker_svc", "common", "bench"]
GENERATED = [
    "cbserve/v1/generation_pb2.py",
    "cbserve/v1/generation_pb2.pyi",
    "cbserve/v1/generation_pb2_grpc.py",
    "cbserve/worker/v1/worker_pb2.py",
    "cbserve/worker/v1/worker_pb2.pyi",
    "cbserve/worker/v1/worker_pb2_grpc.py",
]
BUILD_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def clean_clone(tmp_path_factory) -> Path:
    """The source tree as a clone has it: no generated gRPC code, no caches."""
    tree = tmp_path_factory.mktemp("clone")
    for name in BUILD_INPUTS:
        shutil.copy2(REPO_ROOT / name, tree / name)
    skip = shutil.ignore_patterns("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "__pycache__")
    for name in SOURCE_DIRS:
        shutil.copytree(REPO_ROOT / name, tree / name, ignore=skip)
    assert not list(tree.rglob("*_pb2*.py")), "the copy must start without generated code"
    return tree


def _pip_wheel(source: Path, out: Path) -> Path:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = out.glob("cbserve-*.whl")
    return wheel


def _import_client_from(directory: Path) -> str:
    """Imports cbserve.Client in a fresh interpreter whose first path entry is directory,
    run from elsewhere so that neither this checkout nor its generated code is found."""
    code = (
        "import cbserve, cbserve.v1.generation_pb2_grpc as stubs\n"
        "from cbserve import Client\n"
        "assert Client.__module__ == 'cbserve.client'\n"
        "assert hasattr(stubs, 'GenerationStub')\n"
        "print(cbserve.__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=directory,
        env={"PYTHONPATH": str(directory), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_wheel_of_a_clean_clone_carries_the_grpc_code(clean_clone, tmp_path):
    wheel = _pip_wheel(clean_clone, tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in GENERATED if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    # The build wrote into its build directory, not into the clone.
    assert not list((clean_clone / "cbserve").rglob("*_pb2*.py"))

    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    imported_from = Path(_import_client_from(installed))
    assert imported_from == installed / "cbserve" / "__init__.py"


def test_the_sdist_carries_the_protos_it_builds_from(clean_clone, tmp_path):
    # `pip install cbserve-X.tar.gz` builds the wheel from the sdist: proto/ must be in it.
    build = (
        "import sys; from setuptools.build_meta import build_sdist; print(build_sdist(sys.argv[1]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)],
        cwd=clean_clone,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    sdist = tmp_path / result.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
        archive.extractall(tmp_path / "unpacked", filter="data")
    assert {"setup.py", "proto/cbserve/v1/generation.proto"} <= members
    assert "proto/cbserve/worker/v1/worker.proto" in members
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    wheel = _pip_wheel(unpacked, tmp_path / "dist")
    assert set(GENERATED) <= set(zipfile.ZipFile(wheel).namelist())


def test_an_editable_install_generates_into_the_source_tree(clean_clone, tmp_path):
    # `make env` installs editable: the packages are imported from the tree itself.
    clean_clone = shutil.copytree(clean_clone, tmp_path / "clone")
    build = (
        "import sys; from setuptools.build_meta import build_editable; "
        "print(build_editable(sys.argv[1]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path / "dist")],
        cwd=clean_clone,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    for name in GENERATED:
        assert (clean_clone / name).is_file(), name
    assert Path(_import_client_from(clean_clone)) == clean_clone / "cbserve" / "__init__.py"
