"""The dashboard's routes against a real PostgreSQL: status codes, escaping of hostile
values, the token and CSRF refusals, read-only mode, and actions that change exactly
the rows asked."""

import re
from datetime import timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

import drainer
from drainer.db import connect
from drainer.storage import roundtrip
from drainer.ui import reads
from drainer.ui.app import build
from drainer.ui.auth import COOKIE
from tests.helpers import count
from tests.test_footprint import reset_statement_counts, statements
from tests.ui.conftest import APP_NAME, TOKEN, client_for, settings_for

PAGES = ("/", "/jobs", "/failed", "/schedules", "/doctor")
HOSTILE = "<script>alert('x')</script>"


def fail(conn: psycopg.Connection, queue: str, error: str, n: int = 1, **fields) -> list[int]:
    """`n` failed jobs of `queue` with `error`; their ids."""
    ids = [drainer.enqueue(conn, queue, {"n": i}, **fields) for i in range(n)]
    conn.execute("UPDATE jobs SET status = 'failed', last_error = %s, attempts = 5 "
                 "WHERE id = ANY(%s)", (error, ids))
    return ids


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', page)[1]


def status_of(conn: psycopg.Connection, job_id: int) -> tuple[str, str | None]:
    return conn.execute("SELECT status, last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()


def test_every_page_answers_and_escapes_what_the_database_holds(client, conn):
    hostile = fail(conn, HOSTILE, f"ValueError: {HOSTILE}", key=f"k{HOSTILE}",
                   group=HOSTILE)[0]
    drainer.enqueue(conn, "mail", {"body": HOSTILE, '"><img src=x onerror=alert(1)>': 1})
    pages = [*PAGES, f"/jobs/{hostile}", f"/jobs/{hostile + 1}",
             f"/jobs?queue={HOSTILE}&error=alert", f"/failed/group?queue={HOSTILE}"
             f"&error=ValueError: {HOSTILE}"]
    for path in pages:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text)
        assert "<script>alert" not in answer.text and "<img src=x" not in answer.text, path
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    assert "&lt;script&gt;alert(" in client.get(f"/jobs/{hostile}").text
    assert "&lt;script&gt;alert(" in client.get(f"/jobs/{hostile + 1}").text  # the payload
    assert "&lt;script&gt;" in client.get("/failed").text


def test_a_request_without_the_token_is_refused(db_url):
    app = build(settings_for(db_url))
    with TestClient(app, follow_redirects=False) as anonymous:
        for path in (*PAGES, "/jobs/1"):
            assert anonymous.get(path).status_code == 401
        assert anonymous.get("/?token=wrong").status_code == 401
        anonymous.cookies.set(COOKIE, TOKEN)  # the token itself is not the cookie's value
        assert anonymous.get("/").status_code == 401
    with TestClient(app, follow_redirects=False) as script:
        assert script.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = script.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200 and COOKIE not in script.cookies


def test_the_url_with_the_token_sets_a_strict_cookie_and_drops_the_token(db_url):
    with TestClient(build(settings_for(db_url)), follow_redirects=False) as browser:
        first = browser.get(f"/jobs?queue=mail&token={TOKEN}&state=failed")
        assert first.status_code == 303
        assert first.headers["location"] == "/jobs?queue=mail&state=failed"
        cookie = first.headers["set-cookie"]
        assert TOKEN not in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
        page = browser.get(first.headers["location"])
        assert page.status_code == 200 and TOKEN not in page.text
        assert page.headers["referrer-policy"] == "same-origin"


def test_an_action_needs_the_csrf_field_from_this_origin(client, conn):
    job_id = drainer.enqueue(conn, "mail", {})
    token = csrf_of(client.get(f"/jobs/{job_id}").text)
    refused = [client.post(f"/jobs/{job_id}/cancel"),
               client.post(f"/jobs/{job_id}/cancel", data={"csrf": "0" * 64}),
               client.post(f"/jobs/{job_id}/cancel", data={"csrf": token},
                           headers={"Origin": "https://evil.example"})]
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert status_of(conn, job_id) == ("queued", None)
    done = client.post(f"/jobs/{job_id}/cancel", data={"csrf": token},
                       headers={"Origin": "http://testserver"})
    assert done.status_code == 200 and "1 of 1 cancelled" in done.text
    assert status_of(conn, job_id) == ("failed", "cancelled")


def test_a_script_with_the_bearer_token_needs_no_csrf_field(db_url, conn):
    job_id = fail(conn, "mail", "Boom")[0]
    with TestClient(build(settings_for(db_url))) as script:
        answer = script.post(f"/jobs/{job_id}/requeue",
                             headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200
    assert status_of(conn, job_id) == ("queued", None)


def test_requeue_and_cancel_change_only_the_job_asked(client, conn):
    failed = fail(conn, "mail", "Boom", n=3)
    queued = [drainer.enqueue(conn, "mail", {"q": i}) for i in range(3)]
    token = csrf_of(client.get(f"/jobs/{failed[1]}").text)
    assert client.post(f"/jobs/{failed[1]}/requeue", data={"csrf": token}).status_code == 200
    assert client.post(f"/jobs/{queued[1]}/cancel", data={"csrf": token}).status_code == 200
    assert [status_of(conn, i)[0] for i in failed] == ["failed", "queued", "failed"]
    assert [status_of(conn, i)[1] for i in queued] == [None, "cancelled", None]
    # Done already: nothing changes, and the page says so.
    again = client.post(f"/jobs/{queued[1]}/cancel", data={"csrf": token})
    assert "0 of 1 cancelled" in again.text and "no longer queued or running" in again.text


def test_a_queue_is_paused_and_resumed_from_the_queues_page(client, conn):
    drainer.enqueue(conn, "mail", {})
    drainer.enqueue(conn, "sms", {})
    page = client.get("/").text
    assert 'action="/queues/pause"' in page and ">paused<" not in page
    paused = client.post("/queues/pause", data={"csrf": csrf_of(page), "queue": "mail"},
                         follow_redirects=True)
    assert paused.status_code == 200 and ">paused<" in paused.text
    assert conn.execute("SELECT queue FROM drainer_pauses").fetchall() == [("mail",)]
    claimed = roundtrip.claim(conn, ["mail", "sms"], 10, timedelta(seconds=30))
    assert [job.queue for job in claimed] == ["sms"]  # mail's job waits
    resumed = client.post("/queues/resume", data={"csrf": csrf_of(paused.text),
                                                  "queue": "mail"}, follow_redirects=True)
    assert resumed.status_code == 200 and ">paused<" not in resumed.text
    assert conn.execute("SELECT count(*) FROM drainer_pauses").fetchone()[0] == 0
    refused = client.post("/queues/pause", data={"csrf": "forged", "queue": "mail"})
    assert refused.status_code == 403
    assert conn.execute("SELECT count(*) FROM drainer_pauses").fetchone()[0] == 0


def test_a_groups_requeue_applies_to_exactly_the_jobs_counted(client, conn):
    group = fail(conn, "mail", "Timeout: smtp", n=4)
    other_queue = fail(conn, "sms", "Timeout: smtp")
    other_error = fail(conn, "mail", "KeyError: 'to'")
    confirm = client.get("/failed/group", params={"queue": "mail", "error": "Timeout: smtp"})
    assert confirm.status_code == 200 and "Requeue 4 jobs" in confirm.text
    ids = re.search(r'name="ids" value="([0-9,]*)"', confirm.text)[1]
    assert sorted(map(int, ids.split(","))) == group
    later = fail(conn, "mail", "Timeout: smtp")  # fails after the confirmation was shown
    done = client.post("/failed/requeue", data={"csrf": csrf_of(confirm.text), "ids": ids})
    assert done.status_code == 200 and "4 of 4 requeued" in done.text
    assert count(conn, "status = 'queued'") == 4
    for job_id in (*other_queue, *other_error, *later):
        assert status_of(conn, job_id)[0] == "failed"


def test_read_only_mode_shows_no_action_and_refuses_them(read_only_client, conn):
    failed = fail(conn, "mail", "Boom")[0]
    queued = drainer.enqueue(conn, "mail", {})
    page = read_only_client.get(f"/jobs/{failed}").text
    assert "read-only" in page and "/requeue" not in page and 'name="csrf"' not in page
    assert "/cancel" not in read_only_client.get(f"/jobs/{queued}").text
    assert "Requeue…" not in read_only_client.get("/failed").text
    csrf = read_only_client.app.state.ui.guard.csrf  # what a forged form would need
    assert read_only_client.post(f"/jobs/{failed}/requeue", data={"csrf": csrf}
                                 ).status_code == 403
    assert read_only_client.post(f"/jobs/{queued}/cancel", data={"csrf": csrf}
                                 ).status_code == 403
    assert status_of(conn, failed)[0] == "failed" and status_of(conn, queued)[0] == "queued"


@pytest.fixture
def select_only_url(server, db_url):
    """A login that may only SELECT the queue's tables."""
    login = "drainer_ui_reader"
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(f"DROP ROLE IF EXISTS {login}")
        owner.execute(f"CREATE ROLE {login} LOGIN")
        owner.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {login}")
    yield server.url(psycopg.conninfo.conninfo_to_dict(db_url)["dbname"], login)
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(f"DROP OWNED BY {login}")
        owner.execute(f"DROP ROLE {login}")


def test_read_only_mode_works_under_a_role_that_may_only_select(select_only_url, conn):
    failed = fail(conn, "mail", "Boom")[0]
    drainer.enqueue(conn, "mail", {})
    with connect(select_only_url) as reader, pytest.raises(
            psycopg.errors.InsufficientPrivilege):  # the role really cannot write
        reader.execute("UPDATE jobs SET attempts = 0")
    with client_for(settings_for(select_only_url, read_only=True, known=["other"])) as c:
        for path in (*PAGES, f"/jobs/{failed}", "/failed/group?queue=mail&error=Boom"):
            answer = c.get(path)
            assert answer.status_code == 200, (path, answer.text.split("<main>")[1])
        assert "no task" in c.get("/").text  # mail's ready job: no task of `known` runs it


def test_each_request_opens_its_own_connection_and_closes_it(server, client, db_url):
    drainer_dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    for path in PAGES:
        assert client.get(path).status_code == 200
    with server.admin() as admin:
        sessions = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (drainer_dbname, APP_NAME)).fetchone()[0]
    assert sessions == 0


def test_a_missing_job_is_404_and_an_unmigrated_table_asks_for_migrate(client, empty_db_url):
    assert client.get("/jobs/424242").status_code == 404
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                     "queue text NOT NULL, payload jsonb NOT NULL, status text NOT NULL, "
                     "run_at timestamptz, attempts int, max_attempts int, "
                     "locked_until timestamptz, last_error text, created_at timestamptz)")
    with client_for(settings_for(empty_db_url)) as c:
        answer = c.get("/")
    assert answer.status_code == 503 and "drainer migrate" in answer.text


def test_an_unreachable_database_is_a_page_that_shows_no_password(server):
    url = "postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere"
    with client_for(settings_for(url)) as c:
        answer = c.get("/")
    assert answer.status_code == 503
    assert "s3cret-pw" not in answer.text and "nowhere" not in answer.text.split("<main>")[0]


def test_the_queues_page_counts_and_caps(client, conn, monkeypatch):
    monkeypatch.setattr(reads, "CAP", 5)
    drainer.enqueue_many(conn, "bulk", [{"n": i} for i in range(7)])
    drainer.enqueue(conn, "mail", {})
    fail(conn, "mail", "Boom", n=2)
    page = client.get("/").text
    bulk = page.split(">bulk</a>")[1].split("</tr>")[0]
    assert "&gt;&nbsp;5" in bulk  # 7 queued: "more than 5"
    mail = page.split(">mail</a>")[1].split("</tr>")[0]
    assert re.search(r">1</a>", mail) and re.search(r'class="bad"[^>]*>2</a>', mail)


def test_the_jobs_list_pages_by_id_and_filters(client, conn, monkeypatch):
    rare = fail(conn, "mail", "RareError: needle")[0]
    ids = [drainer.enqueue(conn, "mail", {"n": i}) for i in range(120)]
    first = client.get("/jobs").text
    assert [int(i) for i in re.findall(r'href="/jobs/(\d+)"', first)] == ids[::-1][:50]
    assert int(re.search(r'href="/jobs\?before=(\d+)"', first)[1]) == ids[70]
    last = client.get(f"/jobs?before={ids[20]}").text
    assert [int(i) for i in re.findall(r'href="/jobs/(\d+)"', last)] == [*ids[:20][::-1], rare]
    assert "Older" not in last
    monkeypatch.setattr(reads, "CAP", 10)  # a page reads 10 jobs: the match is further
    window = client.get("/jobs?error=NEEDLE").text
    assert f'href="/jobs/{rare}"' not in window and "among these 10" in window
    assert int(re.search(r'error=NEEDLE&amp;before=(\d+)">Older', window)[1]) == ids[-10]
    assert f'href="/jobs/{rare}"' in client.get("/jobs?state=failed&queue=mail&error=needle").text
    assert f'href="/jobs/{rare}"' in client.get(f"/jobs?error=needle&before={ids[0]}").text


def test_a_page_load_is_a_few_statements(server, client, conn, db_url):
    fail(conn, "mail", "Boom", n=3)
    drainer.enqueue(conn, "mail", {})
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    for path in ("/", "/jobs", "/jobs/1", "/failed", "/schedules",
                 "/failed/group?queue=mail&error=Boom"):
        reset_statement_counts(server)
        assert client.get(path).status_code == 200
        assert statements(server, dbname) <= 4, path  # the schema's features, then the page's
