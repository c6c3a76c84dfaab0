"""Log records as JSON lines on stdout, as the cloud platforms read them: a
record's level under the platform's key, its message, the invocation's id, and
whatever the call put in `extra={"data": {...}}`. The AWS and Google Cloud
functions each install one formatter on the `drainer` loggers."""

import json
import logging
import sys
from datetime import datetime
from typing import TextIO


def as_text(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


class JsonLines(logging.Formatter):
    """One JSON object a record; `level` and `request` name the keys of its level
    and of the invocation's id (`request_id`, set per invocation)."""

    def __init__(self, *, level: str, request: str) -> None:
        super().__init__()
        self.level_key, self.request_key = level, request
        self.request_id: str | None = None

    def format(self, record: logging.LogRecord) -> str:
        line = {self.level_key: record.levelname, "logger": record.name,
                "message": record.getMessage(), self.request_key: self.request_id}
        line.update(getattr(record, "data", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=as_text)


class _Stdout(logging.StreamHandler[TextIO]):
    """Writes to whatever sys.stdout is at the time (the runtime, or a test, may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


def install(formatter: JsonLines, level: int) -> None:
    """Route the `drainer` loggers to `formatter`'s lines on stdout at `level` (once
    per process; with propagation on, a runtime's own root handler would print each
    line again, in text)."""
    root = logging.getLogger("drainer")
    root.setLevel(level)
    if not any(h.formatter is formatter for h in root.handlers):
        handler = _Stdout()
        handler.setFormatter(formatter)
        root.addHandler(handler)
        root.propagate = False


def uninstall(formatter: JsonLines) -> None:
    """Undo `install`: the `drainer` loggers propagate again, at no level of their
    own (for tests, which read log records through the root logger)."""
    root = logging.getLogger("drainer")
    handlers = [h for h in root.handlers if h.formatter is formatter]
    for handler in handlers:
        root.removeHandler(handler)
    if handlers:
        root.setLevel(logging.NOTSET)
        root.propagate = True
    formatter.request_id = None
