"""The `main` of a benchmark whose flags are a config dataclass's (common/cli_config.py):
parse, build the frozen config (a bad value is argparse's error, naming the flag), and
run it with the command line recorded for its results."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from common.cli_config import FlagError, add_flags, build


def flag_main(
    config_class: type,
    run: Callable[[Any, str], int],
    argv: list[str] | None,
    prog: str,
    description: str,
) -> int:
    from bench.serving.options import recorded_command

    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_flags(parser, config_class)
    args = parser.parse_args(argv)
    try:
        config = build(config_class, args)
    except FlagError as error:
        parser.error(str(error))
    given = sys.argv[1:] if argv is None else argv
    return run(config, recorded_command([*prog.split(), *given]))
