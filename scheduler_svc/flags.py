"""The scheduler's command line: every flag is a field of one of SCHEDULER_CONFIGS
(scheduler_svc/config/), with CBSERVE_SCHEDULER_<FLAG> as its default. Its own
module, so that the core and the API processes (scheduler_svc/split/) read the same
flags without importing the entry point.
"""

from __future__ import annotations

import argparse

from cbserve.v1 import generation_pb2 as pb
from common.cli_config import FlagError, add_flags, build
from scheduler_svc.config import (
    SCHEDULER_CONFIGS,
    EdgeConfig,
    FaultConfig,
    ProcessConfig,
    SchedulerConfig,
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Generation"].full_name
DESCRIPTION = (
    "python -m scheduler_svc --port 50051 {--worker HOST:PORT ... | --worker-dns NAME:PORT}"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler_svc", description=DESCRIPTION)
    for config_class in SCHEDULER_CONFIGS:
        add_flags(parser, config_class)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed flags, checked by the configs they make (a bad one exits with usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configs_from_args(args)
        edge_config_from_args(args)
    except FlagError as error:
        parser.error(str(error))
    return args


def configs_from_args(
    args: argparse.Namespace,
) -> tuple[ProcessConfig, SchedulerConfig, FaultConfig]:
    return build(ProcessConfig, args), build(SchedulerConfig, args), build(FaultConfig, args)


def edge_config_from_args(args: argparse.Namespace) -> EdgeConfig:
    """The HTTP front, keys and TLS (EdgeConfig in scheduler_svc/config/edge.py)."""
    return build(EdgeConfig, args)
