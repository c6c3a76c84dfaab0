"""Google Cloud in-process: fake Cloud Tasks and Secret Manager services reached by
the official clients (tests/gcp/services.py), the function's app made by the
Functions Framework and driven with Flask's test client, a real PostgreSQL. No
drainer or libpq setting leaks in from the outer environment."""

import os
from collections.abc import Iterator
from dataclasses import dataclass

import functions_framework
import pytest

from drainer.gcp import clients
from tests.gcp import services
from tests.helpers import ROOT

PROJECT = "proj"
QUEUE = f"projects/{PROJECT}/locations/europe-west1/queues/drainer"
URL = "https://europe-west1-proj.cloudfunctions.net/drainer"
ACCOUNT = f"drainer-invoker@{PROJECT}.iam.gserviceaccount.com"
SOURCE = ROOT / "handlers" / "gcp.py"


@dataclass
class Cloud:
    tasks: services.Tasks
    secrets: services.Secrets


@pytest.fixture(autouse=True)
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    for name in list(os.environ):
        if name.startswith(("DRAINER_", "PG", "GOOGLE_")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("K_SERVICE", "drainer")  # as on Cloud Run
    # What the framework sets as it loads a function is undone after each test by
    # tests/conftest.py's framework_environment.
    world = Cloud(services.Tasks(), services.Secrets())
    with services.serving(world.tasks, world.secrets) as address:
        tasks, secrets = services.tasks_client(address), services.secrets_client(address)
        monkeypatch.setattr(clients, "tasks", lambda: tasks)
        monkeypatch.setattr(clients, "secrets", lambda: secrets)
        yield world
        tasks.transport.close()
        secrets.transport.close()


@pytest.fixture
def function_env(monkeypatch: pytest.MonkeyPatch, db_url: str) -> str:
    """The function's environment as the recipe deploys it, on a fresh database."""
    for name, value in {"DATABASE_URL": db_url, "DRAINER_TASKS": "tests.gcp.tasks",
                        "DRAINER_QUEUES": "gcp", "DRAINER_FUNCTION_TIMEOUT": "120",
                        "DRAINER_TASKS_QUEUE": QUEUE, "DRAINER_WAKE_URL": URL,
                        "DRAINER_TASKS_SERVICE_ACCOUNT": ACCOUNT}.items():
        monkeypatch.setenv(name, value)
    return db_url


@pytest.fixture
def http():
    """The HTTP function, as Cloud Run serves it."""
    return functions_framework.create_app("drain_http", str(SOURCE), "http").test_client()


@pytest.fixture
def pubsub():
    """The Pub/Sub function: its requests are CloudEvents."""
    return functions_framework.create_app("drain_pubsub", str(SOURCE),
                                          "cloudevent").test_client()
