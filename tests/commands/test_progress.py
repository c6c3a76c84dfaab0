"""Progress: a live line redrawn on a terminal, only log lines otherwise."""

import io
import logging

from freezegun import freeze_time

from drainer.commands.progress import Progress
from drainer.run import Summary


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_live_line_that_is_cleared_at_the_end(caplog):
    stream = Terminal()
    with freeze_time("2026-12-02 12:00:00") as frozen, caplog.at_level(logging.INFO):
        progress = Progress(stream)
        frozen.tick(2)
        progress.update(Summary(done=500, failed=3))
        progress.finish(Summary(done=900, failed=3, stopped="empty"))
    assert "\rdone 500" in stream.getvalue().replace("\x1b[K", "")
    assert "250 jobs/s" in stream.getvalue()
    assert stream.getvalue().endswith("\r\x1b[K")
    assert "done 900" in caplog.text and "stopped: empty" in caplog.text


def test_a_pipe_gets_no_control_characters(caplog):
    stream = io.StringIO()
    with freeze_time("2026-12-02 12:00:00") as frozen, caplog.at_level(logging.INFO):
        progress = Progress(stream)
        frozen.tick(1)
        progress.update(Summary(done=1))
        frozen.tick(Progress.LOG_EVERY)
        progress.update(Summary(done=2))
    assert stream.getvalue() == ""
    assert [r.getMessage()[:6] for r in caplog.records] == ["done 2"]
