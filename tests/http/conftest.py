"""The HTTP entry point's environment: a fresh database, the task module, a shared
secret and a bearer token, and nothing else of drainer's or libpq's from outside."""

import os

import pytest

from tests.http.helpers import SECRET, TOKEN


@pytest.fixture
def web_env(monkeypatch: pytest.MonkeyPatch, db_url: str) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(("DRAINER_", "PG")) or name == "DATABASE_URL":
            monkeypatch.delenv(name)
    env = {"DATABASE_URL": db_url, "DRAINER_TASKS": "tests.http.tasks",
           "DRAINER_HTTP_SECRET": SECRET, "DRAINER_HTTP_TOKEN": TOKEN}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env
