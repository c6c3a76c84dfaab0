"""AWS in-process: moto's mock_aws for Secrets Manager, Scheduler and RDS token
signing, botocore's Stubber for Lambda invokes (moto would run the function in
Docker), fake credentials and region. Nothing here reaches the network. The names
and the fake Lambda context the tests share are in tests/aws/helpers.py."""

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from drainer.aws import clients
from tests.aws.helpers import FUNCTION, FUNCTION_ARN, GROUP, REGION, ROLE_ARN


@pytest.fixture(autouse=True)
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """A clean AWS world: fake credentials, one region, moto, no drainer or libpq
    settings leaking in from the outer environment. Cached clients and secrets,
    pending kicks and the log handler go after each test (tests/conftest.py)."""
    for name in list(os.environ):
        if name.startswith(("DRAINER_", "PG", "AWS_")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
                        "AWS_CONFIG_FILE": str(tmp_path / "none"),
                        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                        "AWS_LAMBDA_FUNCTION_NAME": FUNCTION}.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield


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

