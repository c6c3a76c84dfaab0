"""Logs in the function: JSON lines on stdout, and one CloudWatch Embedded Metric
Format line per run, so CloudWatch turns the run's counts into metrics with no
agent, no API call and no extra dependency."""

import json
import logging
import sys
from datetime import datetime

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


class _Stdout(logging.StreamHandler):
    """Writes to whatever sys.stdout is at the time (the runtime, or a test, may swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stdout
        super().emit(record)


_formatter = JsonLines()


def setup(request_id: str | None) -> None:
    """Route the `drainer` loggers to JSON lines on stdout (once per process; with
    propagation on, Lambda's own root handler would print each line again, in text)."""
    _formatter.request_id = request_id
    root = logging.getLogger("drainer")
    if not any(h.formatter is _formatter for h in root.handlers):
        handler = _Stdout()
        handler.setFormatter(_formatter)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False


def metric_line(summary: Summary, *, namespace: str, function: str, **fields: object) -> str:
    """The run's EMF record: the counts and seconds as metrics under the
    FunctionName dimension, `fields` as searchable properties."""
    metrics = [{"Name": name, "Unit": "Count"} for name in COUNTS]
    metrics.append({"Name": "seconds", "Unit": "Seconds"})
    record = {
        "_aws": {"Timestamp": int(clock.wall() * 1000), "CloudWatchMetrics": [
            {"Namespace": namespace, "Dimensions": [["FunctionName"]], "Metrics": metrics}]},
        "FunctionName": function,
        **{name: getattr(summary, name) for name in COUNTS},
        "seconds": round(summary.seconds, 3),
        **fields,
    }
    return json.dumps(record, default=_text)
