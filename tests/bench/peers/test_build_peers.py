"""bench/peers/build_llama_server.sh's cache check: llama-server, llama-perplexity and
llama-quantize, or a rebuild. Fake binaries stand in for the real ones; PATH without cmake stops a
rebuild at its first step, which says what is missing, so nothing is built here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.peers import llama_perplexity, llama_server

pytestmark = pytest.mark.process  # runs bash
VERSION = llama_server.LLAMA_CPP_PYTHON_VERSION


def _fake_binary(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho fake llama.cpp\n")
    path.chmod(0o755)


def _build(root: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": str(root / "no-tools"),
        "HOME": str(root),
        "LLAMA_CPP_PYTHON_VERSION": VERSION,
        "CBSERVE_PEERS_CACHE": str(root / "cache"),
    }
    script = str(llama_server.BUILD_SCRIPT)
    return subprocess.run(["/bin/bash", script], env=env, capture_output=True, text=True)


def _bin(root: Path) -> Path:
    return root / "cache" / "llama.cpp" / VERSION / "bin"


def test_a_cache_with_every_binary_is_kept(tmp_path):
    for name in ("llama-server", "llama-perplexity", "llama-quantize"):
        _fake_binary(_bin(tmp_path) / name)
    done = _build(tmp_path)
    assert done.returncode == 0 and "is built" in done.stdout


def test_a_cache_without_llama_quantize_is_rebuilt(tmp_path):
    _fake_binary(_bin(tmp_path) / "llama-server")
    _fake_binary(_bin(tmp_path) / "llama-perplexity")
    done = _build(tmp_path)
    assert done.returncode == 1 and "cmake is needed" in done.stderr


def test_a_cache_with_only_llama_server_is_rebuilt(tmp_path):
    _fake_binary(_bin(tmp_path) / "llama-server")
    done = _build(tmp_path)
    # past the cache check, at the rebuild's first step (no cmake on this PATH)
    assert done.returncode == 1 and "cmake is needed" in done.stderr


def test_the_lookups_find_the_cached_binaries(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path / "cache"))
    assert llama_perplexity.binary_path() is None
    _fake_binary(_bin(tmp_path) / "llama-perplexity")
    assert llama_perplexity.binary_path() == _bin(tmp_path) / "llama-perplexity"
    assert llama_server.binary_path() is None
