"""The function's log level. With JSON logs and an application log level, Lambda
keeps a stdout line only if its `level` is at or above that level, so the run's
metric (EMF) line carries one like the JSON lines do; and the level Lambda sets,
AWS_LAMBDA_LOG_LEVEL, is the `drainer` loggers' level, the metric line printed
only when INFO lines are."""

import json
import logging

import pytest

from drainer import enqueue
from drainer.aws.lambda_handler import handler
from tests.aws.helpers import FakeContext
from tests.helpers import count


def stdout_records(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def test_the_metric_line_carries_the_level_lambda_filters_by(function_env, conn, capsys):
    enqueue(conn, "aws", {})
    assert handler({"source": "drainer.cron"}, FakeContext(60))["done"] == 1
    records = stdout_records(capsys)
    [metric] = [r for r in records if "_aws" in r]
    assert (metric["level"], metric["done"]) == ("INFO", 1)
    assert all(r["level"] in ("INFO", "WARNING", "ERROR") for r in records)  # none dropped


@pytest.mark.parametrize("lambda_level, level", [
    (None, logging.INFO),  # no application log level configured
    ("TRACE", logging.DEBUG),
    ("DEBUG", logging.DEBUG),
    ("INFO", logging.INFO),
    ("WARN", logging.WARNING),
    ("ERROR", logging.ERROR),
    ("FATAL", logging.CRITICAL),
    ("LOUD", logging.INFO),  # not one of Lambda's: as if none were set
])
def test_the_level_lambda_sets_is_the_drainer_loggers_level(function_env, conn, capsys,
                                                            monkeypatch, lambda_level, level):
    if lambda_level:
        monkeypatch.setenv("AWS_LAMBDA_LOG_LEVEL", lambda_level)
    monkeypatch.delenv("DRAINER_SCHEDULER_ROLE_ARN")  # so a job due later logs a warning
    enqueue(conn, "aws", {})
    enqueue(conn, "aws", {}, delay=300)
    result = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (result["done"], result["next"], result["outcome"]) == (1, "wake", "not armed")
    assert count(conn, "status = 'done'") == 1  # the level changes what is said, not done
    assert logging.getLogger("drainer").getEffectiveLevel() == level
    records = stdout_records(capsys)
    metric = [r for r in records if "_aws" in r]
    assert len(metric) == (level <= logging.INFO)
    said = {r["level"] for r in records if "_aws" not in r}
    assert said == {name for name in ("INFO", "WARNING")
                    if logging.getLevelNamesMapping()[name] >= level}
    assert ("wake_unconfigured" in {r.get("event") for r in records}) == (level <= logging.WARNING)
