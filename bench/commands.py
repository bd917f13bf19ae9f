"""The subcommands of `cbserve bench` and `python -m bench`: one table for both doors.

A first word that names a row runs that row's `main(argv, prog)`, whose flags are its
own; any other command line is the serving benchmark's (bench.serving.serve). Free of
heavy imports, so that building the `cbserve` command line stays quick.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str  # defines main(argv, prog) -> exit status
    help: str


SUBCOMMANDS = {
    "scheduler": Subcommand(
        "bench.scheduler.run", "the scheduler's capacity and CPU cost, with null workers"
    ),
    "speculation": Subcommand(
        "bench.speculation.run",
        "n-gram speculative decoding off and on, side by side (edit, summarize, chat)",
    ),
    "accuracy": Subcommand(
        "bench.accuracy.gate", "the accuracy gate of every compute path against float32"
    ),
    "formats": Subcommand(
        "bench.formats.run", "the GGUF files people download, each beside llama.cpp"
    ),
    "replicas": Subcommand(
        "bench.replicas.run", "cbserve replicas behind SGLang's gateway: cached prompt tokens"
    ),
}


def run(argv: list[str], prog: str) -> int | None:
    """Runs the subcommand that argv starts with, shown as `prog NAME`; None when argv
    names none (the serving benchmark's command line)."""
    if not argv or argv[0] not in SUBCOMMANDS:
        return None
    module = importlib.import_module(SUBCOMMANDS[argv[0]].module)
    return module.main(argv[1:], prog=f"{prog} {argv[0]}")


def listing(prog: str) -> str:
    """The subcommands, as the serving benchmark's --help ends."""
    width = max(map(len, SUBCOMMANDS))
    rows = [f"  {prog} {name:<{width}}  {row.help}" for name, row in SUBCOMMANDS.items()]
    return "subcommands, each with flags of its own (NAME --help):\n" + "\n".join(rows)
