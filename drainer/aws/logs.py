"""Logs in the function: JSON lines on stdout, and one CloudWatch Embedded Metric
Format line per run, so CloudWatch turns the run's counts into metrics with no
agent, no API call and no extra dependency.

Every line carries a `level`, which is what Lambda filters JSON logs by when the
function has an application log level: a line without one is dropped as soon as
that level is above INFO. The level Lambda sets (AWS_LAMBDA_LOG_LEVEL) is the
`drainer` loggers' level too, so what is not wanted is not even formatted.
"""

import json
import logging
import os
import sys
from datetime import datetime
from typing import TextIO

from .. import clock
from ..run import COUNTS, Summary


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


class JsonLines(logging.Formatter):
    """One JSON object a record: level, logger, message, the invocation's request
    id, and whatever the call put in `extra={"data": {...}}`."""

    def __init__(self) -> None:
        super().__init__()
        self.request_id: str | None = None

    def format(self, record: logging.LogRecord) -> str:
        line = {"level": record.levelname, "logger": record.name,
                "message": record.getMessage(), "request_id": self.request_id}
        line.update(getattr(record, "data", {}))
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=_text)


class _Stdout(logging.StreamHandler[TextIO]):
    """Writes to whatever sys.stdout is at the time (the runtime, or a test, may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


_formatter = JsonLines()

# Lambda's application log levels (AWS_LAMBDA_LOG_LEVEL), as the logging module's.
LAMBDA_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
                 "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}


def level() -> int:
    """The function's log level: AWS_LAMBDA_LOG_LEVEL, which Lambda sets when the
    function's application log level is configured; INFO without it, or for a
    value Lambda does not define."""
    return LAMBDA_LEVELS.get(os.environ.get("AWS_LAMBDA_LOG_LEVEL", "").strip().upper(),
                             logging.INFO)


def setup(request_id: str | None) -> None:
    """Route the `drainer` loggers to JSON lines on stdout at the function's log
    level (the handler once per process; with propagation on, Lambda's own root
    handler would print each line again, in text)."""
    _formatter.request_id = request_id
    root = logging.getLogger("drainer")
    root.setLevel(level())
    if not any(h.formatter is _formatter for h in root.handlers):
        handler = _Stdout()
        handler.setFormatter(_formatter)
        root.addHandler(handler)
        root.propagate = False


def teardown() -> None:
    """Undo `setup`: the `drainer` loggers propagate again, at no level of their own,
    and nothing prints JSON lines (for tests, which read log records through the
    root logger; see drainer.testing.reset)."""
    root = logging.getLogger("drainer")
    handlers = [h for h in root.handlers if h.formatter is _formatter]
    for handler in handlers:
        root.removeHandler(handler)
    if handlers:
        root.setLevel(logging.NOTSET)
        root.propagate = True
    _formatter.request_id = None


def metric_line(summary: Summary, *, namespace: str, function: str, **fields: object) -> str:
    """The run's EMF record: the counts and seconds as metrics under the
    FunctionName dimension, `fields` as searchable properties, at level INFO like
    the run's other lines (without a level, Lambda drops it whenever the
    function's application log level is above INFO)."""
    metrics = [{"Name": name, "Unit": "Count"} for name in COUNTS]
    metrics.append({"Name": "seconds", "Unit": "Seconds"})
    record = {
        "level": logging.getLevelName(logging.INFO),
        "_aws": {"Timestamp": int(clock.wall() * 1000), "CloudWatchMetrics": [
            {"Namespace": namespace, "Dimensions": [["FunctionName"]], "Metrics": metrics}]},
        "FunctionName": function,
        **{name: getattr(summary, name) for name in COUNTS},
        "seconds": round(summary.seconds, 3),
        **fields,
    }
    return json.dumps(record, default=_text)


def print_metrics(summary: Summary, *, namespace: str, function: str, **fields: object) -> bool:
    """Print the run's EMF line if the function logs at INFO (True when it did): at
    WARN or above, Lambda would drop an INFO line anyway."""
    if not logging.getLogger("drainer").isEnabledFor(logging.INFO):
        return False
    print(metric_line(summary, namespace=namespace, function=function, **fields), flush=True)
    return True
