"""The AWS clients drainer uses, created once per process on first use, and the
one call the function and the producers share: an asynchronous invoke.

boto3 is imported here, inside `get`, so importing `drainer.aws` costs nothing
until a client is needed.
"""

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

# Short timeouts and few retries: every call here is on a path with a deadline
# (the function's remaining time, or a producer's request).
TIMEOUTS = {"connect_timeout": 2, "read_timeout": 5, "retries": {"max_attempts": 2,
                                                                  "mode": "standard"}}


# Any, here only: boto3 ships no type information, and a client's methods depend on
# the service named at run time (typing them would take a stub package per service).
@cache
def get(service: str) -> Any:
    """The process's boto3 client for `service` (region and credentials from the
    environment, as Lambda sets them)."""
    import boto3
    from botocore.config import Config

    return boto3.client(service, config=Config(**TIMEOUTS))


_cached = get  # what clear() empties, even while a test has put a stand-in for `get`


def clear() -> None:
    """Forget the clients, so the next `get` makes new ones from the environment as
    it is then (for tests, which change it; see drainer.testing.reset)."""
    _cached.cache_clear()


def invoke_async(function: str, event: Mapping[str, object]) -> None:
    """Queue `event` for `function` (a name or ARN, alias included) with
    InvocationType="Event": returns once Lambda has accepted it, without waiting
    for the run."""
    get("lambda").invoke(FunctionName=function, InvocationType="Event",
                         Payload=json.dumps(event).encode())
