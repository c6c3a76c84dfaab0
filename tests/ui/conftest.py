"""The dashboard's app on the test's own database, and a client that holds its cookie."""

from collections.abc import Iterator
from functools import partial

import pytest

pytest.importorskip("starlette")

from starlette.testclient import TestClient  # noqa: E402

from drainer.commands.doctor import diagnose  # noqa: E402
from drainer.db import connect  # noqa: E402
from drainer.ui.app import build  # noqa: E402
from drainer.ui.web import Settings  # noqa: E402

TOKEN = "test-token-0123456789"
APP_NAME = "drainer ui test"


def settings_for(url: str, **options) -> Settings:
    return Settings(connect=partial(connect, url, application_name=APP_NAME), token=TOKEN,
                    database="testdb", doctor=diagnose, **options)


def client_for(settings: Settings) -> TestClient:
    """A client that visited the URL with the token once, and so holds the cookie."""
    client = TestClient(build(settings), follow_redirects=False)
    first = client.get(f"/?token={TOKEN}")
    assert first.status_code == 303 and first.headers["location"] == "/"
    return client


@pytest.fixture
def client(db_url) -> Iterator[TestClient]:
    with client_for(settings_for(db_url)) as c:
        yield c


@pytest.fixture
def read_only_client(db_url) -> Iterator[TestClient]:
    with client_for(settings_for(db_url, read_only=True)) as c:
        yield c
