"""Flags built from a frozen dataclass: flag beats variable beats default, and a bad
value from either is refused naming the flag and its variable."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar

import pytest

from common.cli_config import FlagError, add_flags, build, to_argv
from common.flag_fields import flag


@dataclass(frozen=True)
class Example:
    ENV_PREFIX: ClassVar[str] = "CBSERVE_EXAMPLE_"

    count: int = flag(3, help="how many")
    wait_s: float = flag(0.5, name="wait", help="seconds")
    mode: str = flag("fast", choices=("fast", "slow"), help="how")
    caching: bool = flag(True, help="share")
    quiet: bool = flag(False, switch=True, help="say less")
    peer: list[str] = flag(default_factory=list, help="a peer; repeat for several")
    path: str | None = flag(None, env_aliases=("CBSERVE_OLD_PATH",), help="where")
    blocks: int | None = flag(None, excludes=("memory",), help="pool in blocks")
    memory: int | None = flag(None, excludes=("blocks",), help="pool in bytes")
    unflagged: int = 7

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"count must be >= 1, got {self.count}")


def parser(forward_to: str | None = None) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="example")
    add_flags(made, Example, forward_to=forward_to)
    return made


def parse(*argv: str) -> Example:
    return build(Example, parser().parse_args(argv))


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("COUNT", "WAIT", "MODE", "CACHING", "QUIET", "PEER", "PATH", "BLOCKS", "MEMORY"):
        monkeypatch.delenv(f"CBSERVE_EXAMPLE_{name}", raising=False)
    monkeypatch.delenv("CBSERVE_OLD_PATH", raising=False)


def test_the_default_when_neither_flag_nor_variable():
    assert parse() == Example()
    assert parse().peer == []


def test_the_variable_beats_the_default(monkeypatch):
    monkeypatch.setenv("CBSERVE_EXAMPLE_COUNT", "7")
    monkeypatch.setenv("CBSERVE_EXAMPLE_WAIT", "2.5")
    monkeypatch.setenv("CBSERVE_EXAMPLE_MODE", "slow")
    config = parse()
    assert (config.count, config.wait_s, config.mode) == (7, 2.5, "slow")


def test_the_flag_beats_the_variable(monkeypatch):
    monkeypatch.setenv("CBSERVE_EXAMPLE_COUNT", "7")
    assert parse("--count", "9").count == 9
    # A bad variable that a flag overrides is never read.
    monkeypatch.setenv("CBSERVE_EXAMPLE_COUNT", "many")
    assert parse("--count", "2").count == 2


def test_booleans_from_flags_and_variables(monkeypatch):
    assert parse("--no-caching").caching is False
    assert parse("--quiet").quiet is True
    monkeypatch.setenv("CBSERVE_EXAMPLE_CACHING", "off")
    monkeypatch.setenv("CBSERVE_EXAMPLE_QUIET", "yes")
    assert (parse().caching, parse().quiet) == (False, True)
    assert parse("--caching").caching is True


def test_a_list_variable_is_comma_separated_and_flags_replace_it(monkeypatch):
    monkeypatch.setenv("CBSERVE_EXAMPLE_PEER", "a:1, b:2")
    assert parse().peer == ["a:1", "b:2"]
    assert parse("--peer", "c:3", "--peer", "d:4").peer == ["c:3", "d:4"]


def test_an_older_variable_name_is_read_after_the_main_one(monkeypatch):
    monkeypatch.setenv("CBSERVE_OLD_PATH", "/old")
    assert parse().path == "/old"
    monkeypatch.setenv("CBSERVE_EXAMPLE_PATH", "/new")
    assert parse().path == "/new"


def test_a_flag_clears_the_variable_of_a_flag_it_excludes(monkeypatch, capsys):
    monkeypatch.setenv("CBSERVE_EXAMPLE_MEMORY", "1024")
    assert (parse().blocks, parse().memory) == (None, 1024)
    assert (parse("--blocks", "8").blocks, parse("--blocks", "8").memory) == (8, None)
    with pytest.raises(SystemExit):
        parse("--blocks", "8", "--memory", "64")
    assert "not allowed with argument" in capsys.readouterr().err


def test_an_empty_variable_counts_as_unset(monkeypatch):
    monkeypatch.setenv("CBSERVE_EXAMPLE_COUNT", "")
    assert parse().count == 3


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("CBSERVE_EXAMPLE_COUNT", "many", "argument --count: invalid int value: 'many'"),
        ("CBSERVE_EXAMPLE_MODE", "medium", "argument --mode: invalid choice: 'medium'"),
        ("CBSERVE_EXAMPLE_CACHING", "maybe", "argument --caching/--no-caching: expected"),
    ],
)
def test_a_bad_variable_is_refused_naming_flag_and_variable(
    monkeypatch, capsys, variable, value, expected
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args([])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert expected in error and f"(from {variable})" in error


def test_a_bad_flag_value_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--mode", "medium"])
    assert "argument --mode: invalid choice: 'medium' (choose from fast, slow)" in (
        capsys.readouterr().err
    )


def test_a_value_the_dataclass_refuses_names_the_flag_and_variable(monkeypatch):
    with pytest.raises(FlagError) as refused:
        parse("--count", "0")
    assert str(refused.value) == ("--count (env CBSERVE_EXAMPLE_COUNT): count must be >= 1, got 0")
    monkeypatch.setenv("CBSERVE_EXAMPLE_COUNT", "-1")
    with pytest.raises(FlagError, match="CBSERVE_EXAMPLE_COUNT.*got -1"):
        parse()


def test_help_lists_every_flag_with_its_variable_and_default():
    text = parser().format_help()
    for option, variable in [
        ("--count", "CBSERVE_EXAMPLE_COUNT"),
        ("--wait", "CBSERVE_EXAMPLE_WAIT"),
        ("--no-caching", "CBSERVE_EXAMPLE_CACHING"),
        ("--peer", "CBSERVE_EXAMPLE_PEER"),
        ("--path", "CBSERVE_EXAMPLE_PATH or CBSERVE_OLD_PATH"),
    ]:
        assert option in text and variable in " ".join(text.split()), option
    assert "(default: 3; env" in text
    assert "--unflagged" not in text


def test_forwarded_flags_pass_on_only_what_was_set(monkeypatch):
    assert to_argv(parser("child").parse_args([]), Example) == []
    monkeypatch.setenv("CBSERVE_EXAMPLE_MODE", "slow")
    args = parser("child").parse_args(["--count", "4", "--no-caching", "--peer", "x:1"])
    assert to_argv(args, Example) == [
        "--count", "4", "--mode", "slow", "--no-caching", "--peer", "x:1",
    ]  # fmt: skip
    assert to_argv(args, Example, only=["count"]) == ["--count", "4"]
    # What is passed on parses back to the same values.
    assert build(Example, parser().parse_args(to_argv(args, Example))) == build(Example, args)
