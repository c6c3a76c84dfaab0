"""AWS in-process: moto's mock_aws for Secrets Manager, Scheduler and RDS token
signing, botocore's Stubber for Lambda invokes (moto would run the function in
Docker), fake credentials and region, and a fake Lambda context. Nothing here
reaches the network."""

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from drainer import clock
from drainer.aws import clients, credentials, kick, logs
from tests.test_pgbouncer import bouncer  # noqa: F401 - the PgBouncer fixture, shared

REGION = "us-east-1"
ACCOUNT = "123456789012"
FUNCTION = "drainer"
FUNCTION_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION}:live"  # an alias
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/drainer-scheduler"
GROUP = "drainer-wake"


class FakeContext:
    """What the Lambda runtime passes: remaining time counts down on the clock seam."""

    function_name = FUNCTION
    invoked_function_arn = FUNCTION_ARN
    aws_request_id = "11111111-2222-3333-4444-555555555555"

    def __init__(self, seconds: float):
        self.end = clock.monotonic() + seconds

    def get_remaining_time_in_millis(self) -> int:
        return int((self.end - clock.monotonic()) * 1000)


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """A clean AWS world: fake credentials, one region, moto, no cached clients,
    no drainer or libpq settings leaking in from the outer environment."""
    for name in list(os.environ):
        if name.startswith(("DRAINER_", "PG", "AWS_")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                        "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                        "AWS_LAMBDA_FUNCTION_NAME": FUNCTION}.items():
        monkeypatch.setenv(name, value)
    get = clients.get  # a test may swap it; the cache to clear is the real one's
    get.cache_clear()
    credentials._secrets.clear()
    kick._coalescers.clear()
    with mock_aws():
        yield
    get.cache_clear()
    for coalescer in kick._coalescers.values():  # no trailing kick fires after the test
        if coalescer.timer:
            coalescer.timer.cancel()
    root = logging.getLogger("drainer")  # undo logs.setup: other tests read records
    for handler in [h for h in root.handlers if h.formatter is logs._formatter]:
        root.removeHandler(handler)
    root.propagate = True


@pytest.fixture
def function_env(monkeypatch: pytest.MonkeyPatch, db_url: str) -> str:
    """The function's environment for a drain of queue "aws" on a fresh database, with
    its wake-up schedule group, as the template deploys it."""
    for name, value in {"DATABASE_URL": db_url, "DRAINER_TASKS": "tests.aws.tasks",
                        "DRAINER_QUEUES": "aws", "DRAINER_SCHEDULE_GROUP": GROUP,
                        "DRAINER_SCHEDULER_ROLE_ARN": ROLE_ARN}.items():
        monkeypatch.setenv(name, value)
    boto3.client("scheduler", region_name=REGION).create_schedule_group(Name=GROUP)
    return db_url


@dataclass
class Invokes:
    """The Lambda invokes the code under test made, answered by a Stubber."""

    stubber: Stubber
    sent: list[dict] = field(default_factory=list)
    on_call: Callable[[], None] | None = None  # runs at the moment of each call

    def expect(self, event: dict, function: str = FUNCTION_ARN) -> None:
        self.stubber.add_response("invoke", {"StatusCode": 202}, {
            "FunctionName": function, "InvocationType": "Event",
            "Payload": json.dumps(event).encode()})

    def fail_next(self) -> None:
        self.stubber.add_client_error("invoke", "TooManyRequestsException", http_status_code=429)

    def events(self) -> list[dict]:
        return [json.loads(p["Payload"]) for p in self.sent]


@pytest.fixture
def invokes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invokes]:
    client = boto3.client("lambda", region_name=REGION)
    record = Invokes(Stubber(client))
    # Runs before the Stubber answers, so a test can look at the world as it is
    # at the moment of the call.
    def called(params: dict, **_: object) -> None:
        record.sent.append(dict(params))
        if record.on_call:
            record.on_call()

    client.meta.events.register_first("before-parameter-build.lambda.Invoke", called)
    real = clients.get
    monkeypatch.setattr(clients, "get", lambda s: client if s == "lambda" else real(s))
    with record.stubber:
        yield record

