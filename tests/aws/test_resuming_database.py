"""The Lambda function and a database resuming from a pause (tests/proxy.py in front
of the real PostgreSQL): it waits within DRAINER_CONNECT_TIMEOUT, bounded by the
run's deadline, then drains; or fails the invocation with one line."""

import json

import pytest

from drainer import clock, enqueue
from drainer.errors import DatabaseUnavailable
from handlers.aws_lambda import handler
from tests.aws.helpers import FakeContext
from tests.helpers import count


@pytest.fixture
def resuming(function_env, proxy, monkeypatch):
    """The function's database behind the proxy, each attempt given 2 s."""
    monkeypatch.setenv("DATABASE_URL", proxy.url(function_env) + " connect_timeout=2")
    return proxy


def logged(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


def test_the_run_waits_for_the_database_then_drains(resuming, conn, monkeypatch, capsys):
    for n in range(3):
        enqueue(conn, "aws", {"n": n})
    resuming.set("drop")
    pauses = []

    def sleep(seconds):  # the database is up once the run has paused twice
        pauses.append(seconds)
        if len(pauses) == 2:
            resuming.set("forward")

    monkeypatch.setattr(clock, "sleep", sleep)
    monkeypatch.setenv("DRAINER_CONNECT_TIMEOUT", "300")
    result = handler({"source": "drainer.cron"}, FakeContext(120))
    assert result["done"] == 3 and resuming.accepted["drop"] >= 2
    waiting = [line for line in logged(capsys)
               if "waiting for the database" in line.get("message", "")]
    assert len(waiting) == 1 and waiting[0]["level"] == "WARNING"


@pytest.mark.parametrize(("budget", "remaining", "said"), [
    ("1", 120, "it was tried for 1 s (the connect timeout)"),
    ("600", 22, "it was tried until the run's deadline"),  # 20 s of it are the margin
])
def test_a_database_that_never_answers_fails_the_run(resuming, conn, monkeypatch, budget,
                                                     remaining, said):
    enqueue(conn, "aws", {})
    resuming.set("refuse")
    monkeypatch.setenv("DRAINER_CONNECT_TIMEOUT", budget)
    with pytest.raises(DatabaseUnavailable) as failed:
        handler({"source": "drainer.cron"}, FakeContext(remaining))
    assert str(failed.value).endswith(said) and failed.value.exit_code == 3
    assert count(conn, "status = 'queued'") == 1
