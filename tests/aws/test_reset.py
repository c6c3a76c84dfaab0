"""drainer.testing.reset() and drainer.aws: what one test leaves in the process (a
pending kick, clients, a cached secret, the Lambda log handler) the next never sees."""

import json
import logging
import time

from drainer import testing
from drainer.aws import clients, events, logs
from drainer.aws.credentials import Credentials
from drainer.aws.kick import Kicker
from tests.aws.helpers import FUNCTION, make_secret, secrets


def test_a_pending_trailing_kick_is_cancelled_and_the_interval_forgotten(invokes):
    for _ in range(2):
        invokes.expect(events.kick("email"), function=FUNCTION)
    kicker = Kicker(FUNCTION, interval=0.2)
    assert kicker.kick("email") is True
    assert kicker.kick("email") is False  # folded: one would follow the interval
    testing.reset()
    time.sleep(0.3)
    assert len(invokes.sent) == 1  # the trailing kick never went
    assert Kicker(FUNCTION, interval=0.2).kick("email") is True  # a new interval
    invokes.stubber.assert_no_pending_responses()


def test_clients_and_secrets_are_fetched_again(monkeypatch):
    arn = make_secret({"username": "app", "password": "pw-1", "host": "db.internal"})
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", arn)
    client = clients.get("secretsmanager")
    assert "pw-1" in Credentials.from_env().conninfo()
    secrets().put_secret_value(SecretId=arn, SecretString=json.dumps(
        {"username": "app", "password": "pw-2", "host": "db.internal"}))
    assert "pw-1" in Credentials.from_env().conninfo()  # cached
    testing.reset()
    assert "pw-2" in Credentials.from_env().conninfo()
    assert clients.get("secretsmanager") is not client


def test_the_lambda_log_handler_is_removed():
    root = logging.getLogger("drainer")
    before = list(root.handlers)
    logs.setup("request-1")
    assert not root.propagate and len(root.handlers) == len(before) + 1
    testing.reset()
    assert root.propagate and root.handlers == before and root.level == logging.NOTSET
