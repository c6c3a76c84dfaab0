"""The Google Cloud clients drainer uses, made once per process on first use.

The client libraries are imported here, inside the functions, so importing
`drainer.gcp` costs nothing until a client is needed. Credentials and project come
from the environment (on Cloud Run, the function's service account).
"""

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from google.cloud.secretmanager import SecretManagerServiceClient
    from google.cloud.tasks_v2 import CloudTasksClient

TIMEOUT = 5.0  # seconds per call: every call is on a path with a deadline


@cache
def tasks() -> "CloudTasksClient":
    from google.cloud.tasks_v2 import CloudTasksClient

    return CloudTasksClient()


@cache
def secrets() -> "SecretManagerServiceClient":
    from google.cloud.secretmanager import SecretManagerServiceClient

    return SecretManagerServiceClient()


_cached = (tasks, secrets)  # what clear() empties, even while a test stands in for them


def clear() -> None:
    """Forget the clients, so the next call makes new ones (for tests; see
    drainer.testing.reset)."""
    for made in _cached:
        made.cache_clear()
