"""What the AWS tests share: the names of the fake account's resources, the Lambda
context the runtime would pass, secrets in moto's Secrets Manager, and the
sessions the function leaves open. Fixtures are in tests/aws/conftest.py."""

import contextlib
import json

import boto3
import psycopg

from drainer import clock
from tests.helpers import wait_until

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


def secrets():
    """moto's Secrets Manager (the `aws` fixture's)."""
    return boto3.client("secretsmanager", region_name=REGION)


def make_secret(value: dict | str) -> str:
    """A secret holding `value` (JSON unless a string); its ARN."""
    text = value if isinstance(value, str) else json.dumps(value)
    return secrets().create_secret(Name="drainer-db", SecretString=text)["ARN"]


def sessions(conn: psycopg.Connection) -> int:
    """Sessions the drainer has open on the test's database."""
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND application_name = 'drainer'").fetchone()[0]


def settled_sessions(conn: psycopg.Connection) -> int:
    """sessions(), once closed ones have gone: a closed connection's backend leaves
    pg_stat_activity a moment after the client closes; one kept open stays."""
    with contextlib.suppress(AssertionError):  # still open after a second: kept open
        wait_until(lambda: sessions(conn) == 0, timeout=1)
    return sessions(conn)
