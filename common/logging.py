"""structlog set-up shared by both processes: readable on a terminal, JSON otherwise.

Logs go to stderr; stdout carries only the one "ready" line that launchers
and tests wait for. Under docker, Kubernetes or a test harness stderr is not a
terminal, so every line is one JSON object a log pipeline can index; a person
at a terminal gets aligned key=value lines instead.

Values bound with structlog.contextvars (the scheduler binds `request_id` in
each Generate call) are added to every line logged in that context. Lines
from the standard library's logging (grpc, asyncio) go through the same
renderer, so a JSON stream never has a plain-text line in it.
"""

from __future__ import annotations

import logging
import sys

import structlog


def _renderer(json_lines: bool):
    if json_lines:
        return structlog.processors.JSONRenderer()
    return structlog.dev.ConsoleRenderer(colors=True)


def configure_logging(level: str = "info", json_lines: bool | None = None) -> None:
    """json_lines: None picks JSON exactly when stderr is not a terminal."""
    numeric = logging.getLevelName(level.upper())
    if json_lines is None:
        json_lines = not sys.stderr.isatty()
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    # The console renderer formats exceptions itself (and warns if they already are).
    exceptions = [structlog.processors.format_exc_info] if json_lines else []
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            *exceptions,
            _renderer(json_lines),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # One write per line (print() makes two: the text, then the newline), so that
        # processes sharing one stderr (a split scheduler's API processes) never
        # interleave halves of their lines.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.stdlib.add_logger_name,
                timestamper,
                *exceptions,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _renderer(json_lines),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)


def announce_ready(line: str) -> None:
    """The single stdout line that says the process is serving."""
    print(line, flush=True)
