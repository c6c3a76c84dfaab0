"""Progress on stderr: a live line on a terminal, a log line now and then otherwise."""

import logging
from typing import TextIO

from . import clock

log = logging.getLogger(__name__)


class Progress:
    REDRAW = 0.1  # seconds between terminal redraws
    LOG_EVERY = 10.0  # seconds between plain log lines when stderr is not a terminal

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = stream.isatty()
        self.began = clock.monotonic()
        self.shown = self.began
        self.drawn = False

    def _line(self, summary) -> str:
        elapsed = clock.monotonic() - self.began
        rate = summary.done / elapsed if elapsed > 0 else 0.0
        return (f"done {summary.done}  retried {summary.retried}  failed {summary.failed}  "
                f"lost {summary.lost}  {rate:,.0f} jobs/s  {elapsed:.1f}s")

    def update(self, summary) -> None:
        now = clock.monotonic()
        if self.tty and now - self.shown >= self.REDRAW:
            self.stream.write("\r\x1b[K" + self._line(summary))
            self.stream.flush()
            self.shown, self.drawn = now, True
        elif not self.tty and now - self.shown >= self.LOG_EVERY:
            log.info("%s", self._line(summary))
            self.shown = now

    def finish(self, summary) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
        log.info("%s, stopped: %s", self._line(summary), summary.stopped)
