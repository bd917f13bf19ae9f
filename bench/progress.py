"""A small progress bar on stderr, so the benchmark needs no tqdm.

On a terminal it redraws one line; in a log (CI) it prints a line at every tenth of
the way, so the log shows progress without thousands of carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total = max(total, 0)
        self.label = label
        self.done = 0
        self.stream = stream or sys.stderr
        self.started = time.perf_counter()
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_tenth = -1
        self._draw()

    def update(self, count: int = 1) -> None:
        self.done = min(self.done + count, self.total)
        self._draw()

    def line(self) -> str:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * WIDTH)
        bar = "#" * filled + "-" * (WIDTH - filled)
        elapsed = time.perf_counter() - self.started
        return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:.1f}s"

    def _draw(self) -> None:
        if self._tty:
            self.stream.write("\r" + self.line())
            self.stream.flush()
            return
        tenth = int(10 * self.done / self.total) if self.total else 10
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
