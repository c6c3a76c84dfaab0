"""The HTTP entry point through Starlette's test client, on a real PostgreSQL: a signed
or bearer request drains and answers the summary and what next; every refusal has
its status and claims nothing."""

from datetime import datetime

import pytest
from starlette.testclient import TestClient

from drainer import enqueue
from drainer.http import app, create_app, service
from drainer.wake import ceil_minute
from tests.helpers import count
from tests.http.helpers import SECRET, TOKEN, signed


@pytest.fixture
def client(web_env):
    with TestClient(app) as test_client:
        yield test_client


def untouched(conn, queued: int) -> bool:
    """Nothing was claimed: every job still queued, none ever attempted."""
    return count(conn, "status = 'queued' AND attempts = 0") == count(conn) == queued


def test_a_signed_request_drains_and_answers_the_summary_and_next_due(client, conn):
    for n in range(3):
        enqueue(conn, "web", {"n": n})
    enqueue(conn, "web", {"fail": "boom"}, max_attempts=1)
    later = enqueue(conn, "web", {}, delay=3600)
    answer = client.post("/", content=b"{}", headers=signed())
    assert answer.status_code == 200, answer.text
    summary = answer.json()
    assert (summary["claimed"], summary["done"], summary["failed"]) == (4, 3, 1)
    [(run_at,)] = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [later])
    assert datetime.fromisoformat(summary["next_due"]) == run_at
    assert (summary["next"], summary["at"]) == ("wake", ceil_minute(run_at).isoformat())
    assert count(conn, "status = 'done'") == 3


def test_a_bearer_token_drains(client, conn):
    enqueue(conn, "web", {})
    answer = client.post("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["done"] == 1
    assert (answer.json()["next_due"], answer.json()["next"], answer.json()["at"]) == (
        None, "none", None)


# Each: the request's headers (made when the test runs), its status, what its error says.
REFUSED = {
    "no key": (lambda: {}, 401, "unauthenticated"),
    "bad signature": (lambda: {**signed(), "Drainer-Signature": "0" * 64}, 401,
                      "does not match"),
    "another secret": (lambda: signed(secret="another secret"), 401, "does not match"),
    "another body": (lambda: signed(body=b'{"other": "body"}'), 401, "does not match"),
    "bad timestamp": (lambda: {**signed(), "Drainer-Timestamp": "soon"}, 401, "Unix time"),
    "old timestamp": (lambda: signed(ago=310), 401, "more than 300 s away"),
    "future timestamp": (lambda: signed(ago=-310), 401, "more than 300 s away"),
    "wrong token": (lambda: {"Authorization": "Bearer wrong"}, 401, "token is wrong"),
    "bad runtime": (lambda: {**signed(), "Drainer-Max-Runtime": "0.5"}, 400,
                    "drainer-max-runtime"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_request_claims_nothing(client, conn, case):
    headers, status, said = REFUSED[case]
    enqueue(conn, "web", {})
    answer = client.post("/", content=b"{}", headers=headers())
    assert answer.status_code == status and said in answer.json()["error"], answer.text
    assert untouched(conn, 1)


def test_a_replay_is_refused_by_every_instance_and_claims_nothing(client, conn):
    headers = signed()
    assert client.post("/", content=b"{}", headers=headers).status_code == 200
    enqueue(conn, "web", {})
    with TestClient(create_app()) as another:  # another instance: the memory is shared
        again = another.post("/", content=b"{}", headers=headers)
    assert again.status_code == 409 and "seen already" in again.json()["error"]
    assert untouched(conn, 1)
    # Another request, even in the same second: its body differs (a nonce, say).
    fresh = b'{"nonce": 2}'
    assert client.post("/", content=fresh, headers=signed(fresh)).status_code == 200


def test_without_a_key_every_request_is_refused(client, conn, monkeypatch):
    for name in ("DRAINER_HTTP_SECRET", "DRAINER_HTTP_TOKEN"):
        monkeypatch.delenv(name)
    enqueue(conn, "web", {})
    for headers in (signed(), {"Authorization": f"Bearer {TOKEN}"}, {}):
        answer = client.post("/", content=b"{}", headers=headers)
        assert answer.status_code == 503 and "DRAINER_HTTP_SECRET" in answer.json()["error"]
    assert untouched(conn, 1)


def test_only_the_configured_way_in_is_accepted(client, conn, monkeypatch):
    monkeypatch.delenv("DRAINER_HTTP_TOKEN")
    enqueue(conn, "web", {})
    answer = client.post("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 401 and "sign the request" in answer.json()["error"]
    monkeypatch.setenv("DRAINER_HTTP_TOKEN", TOKEN)
    monkeypatch.delenv("DRAINER_HTTP_SECRET")
    answer = client.post("/", content=b"{}", headers=signed())
    assert answer.status_code == 401 and "bearer token" in answer.json()["error"]
    assert untouched(conn, 1)


def test_before_the_migration_a_signed_request_is_refused_saying_to_migrate(client, conn):
    conn.execute("DROP TABLE drainer_signatures")
    enqueue(conn, "web", {})
    answer = client.post("/", content=b"{}", headers=signed())
    assert answer.status_code == 503 and "drainer migrate" in answer.json()["error"]
    assert untouched(conn, 1)


def test_a_get_drains_as_vercel_cron_sends_it_and_other_methods_are_not_allowed(client,
                                                                                conn):
    enqueue(conn, "web", {})
    assert client.put("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    answer = client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and answer.json()["done"] == 1


@pytest.mark.parametrize(("asked", "cap", "given"), [
    (None, "25", 25.0), ("5", "25", 5.0), ("100", "25", 25.0), ("100", "60", 60.0)])
def test_the_deadline_is_the_header_s_capped_by_the_setting(client, monkeypatch, asked, cap,
                                                            given):
    monkeypatch.setenv("DRAINER_HTTP_MAX_RUNTIME", cap)
    runtimes = []
    real = service.drain_once

    def spy(settings, signature, window, runtime):
        runtimes.append(runtime)
        return real(settings, signature, window, runtime)

    monkeypatch.setattr(service, "drain_once", spy)
    headers = signed() if asked is None else {**signed(), "Drainer-Max-Runtime": asked}
    assert client.post("/", content=b"{}", headers=headers).status_code == 200
    assert runtimes == [given]


def test_a_database_that_is_down_answers_503_with_one_line(client, monkeypatch, proxy,
                                                           db_url):
    proxy.set("refuse")
    monkeypatch.setenv("DATABASE_URL", proxy.url(db_url))
    monkeypatch.setenv("DRAINER_CONNECT_TIMEOUT", "0")
    answer = client.post("/", content=b"{}", headers=signed())
    assert answer.status_code == 503
    assert answer.json()["error"].startswith("database unavailable")
    assert "\n" not in answer.json()["error"] and SECRET not in answer.text



def test_the_repository_s_handler_is_the_packaged_app():
    from handlers.http import app as handler

    assert handler is app
