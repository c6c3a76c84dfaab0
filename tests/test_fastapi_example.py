"""examples/fastapi-app, as a user runs it: a request's order and its job commit
together or not at all, and the drain started after the commit sends the email."""

import sys

import pytest

from tests.helpers import ROOT, wait_until

EXAMPLE = ROOT / "examples" / "fastapi-app"


@pytest.fixture
def client(db_url, monkeypatch):
    from fastapi.testclient import TestClient

    monkeypatch.setenv("DATABASE_URL", db_url)  # as `eval "$(drainer db start)"` sets it
    monkeypatch.delenv("DRAINER_DATABASE_URL", raising=False)
    monkeypatch.delenv("DRAINER_FUNCTION", raising=False)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for name in ("app", "tasks"):
        sys.modules.pop(name, None)
    import app  # the example's module

    with TestClient(app.app) as test_client:
        yield test_client
    for name in ("app", "tasks"):
        sys.modules.pop(name, None)


def test_an_order_and_its_job_commit_together_then_the_drain_runs_it(client, conn):
    response = client.post("/orders", json={"id": 7, "email": "ada@example.com"})
    assert response.status_code == 201, response.text
    job = response.json()["job"]
    assert conn.execute("SELECT email FROM orders").fetchall() == [("ada@example.com",)]
    # The background task ran a drain after the response: the email is sent.
    wait_until(lambda: conn.execute("SELECT status FROM jobs WHERE id = %s", (job,)
                                    ).fetchone() == ("done",))
    assert conn.execute("SELECT order_id FROM sent").fetchall() == [(7,)]


def test_a_failed_request_leaves_neither_the_order_nor_its_job(client, conn):
    response = client.post("/orders", json={"id": 8, "email": "not an address"})
    assert response.status_code == 422
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_an_order_posted_twice_is_a_conflict_and_keeps_one_job(client, conn):
    assert client.post("/orders", json={"id": 9, "email": "ada@example.com"}).status_code == 201
    again = client.post("/orders", json={"id": 9, "email": "ada@example.com"})
    assert again.status_code == 409 and "exists" in again.text
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (1,)
