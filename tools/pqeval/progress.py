"""A progress bar over an evaluation's planned runs: count, rate and time
left (tqdm), drawn only where someone watches: on when stderr is a terminal,
off in a log file or a pipe, where the runs' own lines say the same."""
from __future__ import annotations

import sys
from typing import Callable, Optional, TextIO

from tqdm import tqdm


class Progress:
    """`total` planned runs of `unit`. advance() after each; log(message)
    prints a run's line above the bar (or plainly where there is no bar)."""

    def __init__(self, total: int, unit: str = "run", desc: str = "evaluation",
                 stream: Optional[TextIO] = None, enabled: Optional[bool] = None,
                 log: Callable[[str], None] = print, out: Optional[TextIO] = None):
        """stream: where the bar goes (stderr); out: where log lines go while
        it is shown (stdout); log: how they go when it is not."""
        stream = stream or sys.stderr
        self._out = out
        on = stream.isatty() if enabled is None else enabled
        self.shown = bool(on and total > 0)
        self._log = log
        self._bar = tqdm(total=total, unit=unit, desc=desc, file=stream, dynamic_ncols=True,
                         disable=not self.shown, smoothing=0.1)

    def advance(self) -> None:
        self._bar.update(1)

    def log(self, message: str) -> None:
        if self.shown:
            # Above the bar, which redraws below it.
            self._bar.write(message, file=self._out or sys.stdout)
        else:
            self._log(message)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
