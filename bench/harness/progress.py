"""The benchmark's progress bar: tqdm, drawn as `label [####------] done/total 1.2s`.

On a terminal tqdm redraws its one line. In a log (CI) every redraw would be another
carriage return, thousands for a long run, so off a terminal a whole line is written
only at every tenth of the way.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

WIDTH = 30
BAR_FORMAT = f"{{desc}} [{{bar:{WIDTH}}}] {{n}}/{{total}} {{elapsed_s:.1f}}s"
# tqdm's charset for an ASCII bar: the empty cell first, the full cell last.
BAR_CHARS = "-#"


class Progress(tqdm):
    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        stream = stream or sys.stderr
        self._log = not (hasattr(stream, "isatty") and stream.isatty())
        self._last_tenth = -1
        super().__init__(
            total=max(total, 0),
            desc=label,
            file=stream,
            bar_format=BAR_FORMAT,
            ascii=BAR_CHARS,
            # In a log every update reaches display(), which picks the lines; the
            # last one is written there too, so close() must not repeat it.
            mininterval=0 if self._log else 0.1,
            miniters=1 if self._log else None,
            leave=not self._log,
        )

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._log:
            return super().display(msg, pos)
        if msg is not None:  # tqdm clearing its line at close: a log keeps its lines
            return False
        tenth = 10 * self.n // self.total if self.total else 10
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            self.fp.write(str(self) + "\n")
            self.fp.flush()
        return True
