"""The docs cannot drift from the code: every flag of every command line the project
ships is named on the docs page about that command, every Prometheus metric the code
registers is named on the operations page, and every page is in mkdocs.yml's nav.

The parsers are the real ones, as each command builds them (for a `main` that builds
its parser inline, it is caught at its `parse_args`); the metric names are read from the
real registries. Covered: `python -m worker_svc`, `python -m scheduler_svc`,
`cbserve serve` / `python -m cbserve.launch`, `cbserve generate`, `cbserve info`,
`cbserve bench` and every subcommand of its table (bench/commands.py), `python -m
common.health_probe` and `python -m worker_svc.convert_gguf`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
import yaml

from bench import commands as bench_commands
from bench.commands import SUBCOMMANDS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
# A benchmark's flag may be named on the CLI page or on the benchmarks page.
BENCH_PAGES = "cli.md+benchmarks.md"


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(main: Callable[[], object], monkeypatch: pytest.MonkeyPatch):
    """The parser `main` builds, caught when it parses (nothing after that runs)."""

    def caught(self, *args, **kwargs):
        raise _Parsed(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(_Parsed) as parsed:
            main()
    return parsed.value.parser


def long_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (choices,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return choices.choices[name]


def missing_from(names: Iterable[str], text: str) -> list[str]:
    """The names that text never spells out whole (`--seed` is not found in `--seeds`)."""
    return sorted(
        name for name in names if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
    )


def page(names: str) -> str:
    """The text of the pages named, `+`-joined (`cli.md+benchmarks.md`)."""
    return "\n".join((DOCS / name).read_text() for name in names.split("+"))


def _cli(monkeypatch):
    import cbserve.cli

    return parser_of(lambda: cbserve.cli.main(["info"]), monkeypatch)


def _command_lines(monkeypatch) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each shipped command line -> (its parser, the page that documents it)."""
    from cbserve.launch import add_serve_arguments
    from common.health_probe import build_parser as probe_parser
    from scheduler_svc.flags import build_parser as scheduler_parser
    from worker_svc import convert_gguf
    from worker_svc.__main__ import build_parser as worker_parser

    serve = argparse.ArgumentParser()
    add_serve_arguments(serve)
    cli = _cli(monkeypatch)
    found = {
        "python -m worker_svc": (worker_parser(), "worker-flags.md"),
        "python -m scheduler_svc": (scheduler_parser(), "scheduler-flags.md"),
        "cbserve serve": (serve, "running.md"),
        "cbserve generate": (subparser(cli, "generate"), "cli.md"),
        "cbserve info": (subparser(cli, "info"), "cli.md"),
        "cbserve drain": (subparser(cli, "drain"), "cli.md"),
        "cbserve bench": (subparser(cli, "bench"), BENCH_PAGES),
        "python -m common.health_probe": (probe_parser(), "cli.md"),
        "python -m worker_svc.convert_gguf": (
            parser_of(lambda: convert_gguf.main([]), monkeypatch),
            "cli.md",
        ),
    }
    for name in SUBCOMMANDS:
        # Through the table's own dispatch, which calls each kind of `main` its way.
        parser = parser_of(lambda n=name: bench_commands.run([n], "cbserve bench"), monkeypatch)
        found[f"cbserve bench {name}"] = (parser, BENCH_PAGES)
    return found


def test_every_flag_of_every_command_line_is_on_its_page(monkeypatch):
    command_lines = _command_lines(monkeypatch)
    # The serving processes carry dozens of flags each: a parser caught empty would
    # make the check pass for nothing.
    assert len(long_flags(command_lines["python -m worker_svc"][0])) >= 20
    assert len(long_flags(command_lines["python -m scheduler_svc"][0])) >= 30
    undocumented = {
        f"{command} (docs/{doc})": missing
        for command, (parser, doc) in command_lines.items()
        if (missing := missing_from(long_flags(parser), page(doc)))
    }
    assert not undocumented, f"flags named on no page: {undocumented}"


def registered_metrics() -> set[str]:
    """The cbserve_* names the scheduler's and the worker's registries expose."""
    from scheduler_svc.core.stats import SchedulerStats
    from scheduler_svc.metrics import SchedulerMetrics
    from worker_svc.metrics import WorkerMetrics

    class EmptyPool:  # a pool with no worker yet: every family is still yielded
        engines: dict = {}
        retired_stats = SchedulerStats()

        def connected_engines(self):
            return []

    scheduler = SchedulerMetrics("model")
    scheduler.watch(EmptyPool())
    names = set()
    for registry in (scheduler.registry, WorkerMetrics("model").registry):
        for family in registry.collect():
            # A counter's family drops `_total`; its series (what people query) keep it.
            exposed = family.name + ("_total" if family.type == "counter" else "")
            if exposed.startswith("cbserve_"):
                names.add(exposed)
    return names


def test_every_registered_metric_is_on_the_operations_page():
    names = registered_metrics()
    assert {"cbserve_num_requests_waiting", "cbserve_worker_forward_seconds"} <= names
    assert "cbserve_spec_decode_num_drafts_total" in names
    assert not missing_from(names, page("operations.md"))


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    assert set(nav) == {path.name for path in DOCS.glob("*.md")}


def test_the_check_finds_a_flag_missing_from_a_page():
    text = "`--max-num-seqs` caps a step; `--seeds` is another flag"
    assert missing_from(["--max-num-seqs", "--seed", "--max-num"], text) == [
        "--max-num",
        "--seed",
    ]
