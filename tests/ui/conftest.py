"""The dashboard's app on the test's own database, and a client that holds its cookie."""

import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import pytest
from starlette.testclient import TestClient

from drainer.commands.doctor import diagnose
from drainer.db import connect
from drainer.ui.app import build
from drainer.ui.web import Settings
from tests.helpers import clean_env

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


def started(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> tuple[subprocess.Popen, str]:
    """`drainer ui ARGS` as a real process on a free port, and the URL it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "ui", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or clean_env())
    end = time.monotonic() + timeout
    while select.select([proc.stdout], [], [], max(0, end - time.monotonic()))[0]:
        line = proc.stdout.readline()
        found = re.search(r"dashboard at (\S+)", line)
        if found:
            return proc, found[1]
        if not line:
            break
    proc.kill()
    raise AssertionError(f"no URL printed: {proc.communicate()}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.communicate(timeout=30)
