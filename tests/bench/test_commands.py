"""bench.commands: one subcommand table behind `cbserve bench` and `python -m bench`."""

from __future__ import annotations

import importlib
import inspect
import runpy
import sys

import pytest

from bench import commands
from cbserve.cli import main as cbserve_main


@pytest.mark.parametrize("name", sorted(commands.SUBCOMMANDS))
def test_every_row_names_a_main_that_takes_its_prog(name):
    module = importlib.import_module(commands.SUBCOMMANDS[name].module)
    parameters = inspect.signature(module.main).parameters
    # bench/serving's mains (another owner's) read argv only; run() shows their prog.
    assert "prog" in parameters or module.__name__.startswith("bench.serving.")


def test_a_main_that_returns_nothing_is_a_success(monkeypatch):
    import bench.micro.draft_rows as row

    seen = []
    monkeypatch.setattr(row, "main", lambda argv, prog: seen.append((argv, prog)))
    assert commands.run(["draft-rows", "--drafts", "2"], prog="cbserve bench") == 0
    assert seen == [(["--drafts", "2"], "cbserve bench draft-rows")]


def test_a_main_without_prog_reads_its_flags_from_argv_under_the_shown_name(monkeypatch):
    import bench.serving.memory_pressure as row

    seen = []
    monkeypatch.setattr(row, "main", lambda argv: seen.append((argv, list(sys.argv))) or 3)
    assert commands.run(["memory-pressure", "--fractions", "1"], prog="python -m bench") == 3
    assert seen == [(["--fractions", "1"], ["python -m bench memory-pressure", "--fractions", "1"])]
    assert sys.argv[0] != "python -m bench memory-pressure"


def test_a_command_line_without_a_subcommand_is_left_to_the_serving_benchmark():
    assert commands.run([], prog="cbserve bench") is None
    assert commands.run(["--num-prompts", "3"], prog="cbserve bench") is None


def _help_of(door, argv: list[str], capsys, monkeypatch) -> str:
    with pytest.raises(SystemExit) as done:
        if door == "cbserve":
            cbserve_main(["bench", *argv, "--help"])
        else:
            monkeypatch.setattr(sys, "argv", ["bench", *argv, "--help"])
            runpy.run_module("bench", run_name="__main__", alter_sys=True)
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("door,prog", [("cbserve", "cbserve bench"), ("python", "python -m bench")])
def test_both_doors_list_and_reach_every_subcommand(door, prog, capsys, monkeypatch):
    serving = _help_of(door, [], capsys, monkeypatch)
    assert f"usage: {prog} [-h] [--dataset" in serving
    for name in commands.SUBCOMMANDS:
        assert f"{prog} {name} " in serving
        own = _help_of(door, [name], capsys, monkeypatch)
        module = commands.SUBCOMMANDS[name].module
        assert own.startswith((f"usage: {prog} {name} ", f"usage: python -m {module} "))
