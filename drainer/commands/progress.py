"""Progress on stderr: a live line on a terminal, a log line now and then otherwise."""

import logging
import os
from typing import TextIO

from .. import clock
from ..run import Summary
from .signals import MEMBER

log = logging.getLogger(__name__)


def totals(summary: Summary, seconds: float) -> str:
    """A run's counts, rate and time in one wording, whichever command logs them (the
    live line, a drain's end, each of `work`'s drains and its end): a user comparing
    two commands' logs should not have to translate."""
    extra = "".join(f"  {name} {getattr(summary, name)}" for name in ("reaped", "archived")
                    if getattr(summary, name))
    rate = summary.done / seconds if seconds > 0 else 0.0
    return (f"done {summary.done}  retried {summary.retried}  failed {summary.failed}  "
            f"lost {summary.lost}{extra}  {rate:,.0f} jobs/s  {seconds:.1f}s")


def closing(summary: Summary, seconds: float) -> str:
    """The end-of-run line of `drain` and `work`: the totals and why the run stopped."""
    return f"{totals(summary, seconds)}, stopped: {summary.stopped}"


class Progress:
    REDRAW = 0.1  # seconds between terminal redraws
    LOG_EVERY = 10.0  # seconds between plain log lines when stderr is not a terminal

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = stream.isatty()
        # A member of `--processes`: the process that started it reports for all.
        self.member = bool(os.environ.get(MEMBER))
        self.began = clock.monotonic()
        self.shown = self.began
        self.drawn = False

    def _line(self, summary: Summary) -> str:
        return totals(summary, clock.monotonic() - self.began)

    def update(self, summary: Summary) -> None:
        if self.member:
            return
        now = clock.monotonic()
        if self.tty and now - self.shown >= self.REDRAW:
            self.stream.write("\r\x1b[K" + self._line(summary))
            self.stream.flush()
            self.shown, self.drawn = now, True
        elif not self.tty and now - self.shown >= self.LOG_EVERY:
            log.info("%s", self._line(summary))
            self.shown = now

    def finish(self, summary: Summary) -> None:
        if self.member:
            return
        if self.drawn:
            self.stream.write("\r\x1b[K")
        log.info("%s", closing(summary, clock.monotonic() - self.began))
