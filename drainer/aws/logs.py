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

from .. import clock, jsonlines
from ..jsonlines import JsonLines
from ..run import COUNTS, Summary

_formatter = JsonLines(level="level", request="request_id")

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
    level (the handler once per process)."""
    _formatter.request_id = request_id
    jsonlines.install(_formatter, level())


def teardown() -> None:
    """Undo `setup` (for tests; see drainer.testing.reset)."""
    jsonlines.uninstall(_formatter)


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
    return json.dumps(record, default=jsonlines.as_text)


def print_metrics(summary: Summary, *, namespace: str, function: str, **fields: object) -> bool:
    """Print the run's EMF line if the function logs at INFO (True when it did): at
    WARN or above, Lambda would drop an INFO line anyway."""
    if not logging.getLogger("drainer").isEnabledFor(logging.INFO):
        return False
    print(metric_line(summary, namespace=namespace, function=function, **fields), flush=True)
    return True
