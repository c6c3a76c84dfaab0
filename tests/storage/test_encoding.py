"""Databases in another encoding than UTF-8: what fits is stored and reaches its
handler, what does not fit is refused whole as BadInput (exit 2), and a handler's
error message never takes its batch down for a character the database lacks.

Each test runs on a UTF-8 and on a LATIN1 database ('é' fits both, an emoji only
the first); a connection of the user's own speaks the server's encoding.
"""

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import clock, schedules
from drainer import db as drainer_db
from drainer.db import connect
from drainer.errors import BadInput
from drainer.run import Options, Summary, drain
from drainer.schedules import Schedule
from drainer.storage.schema import migrate
from drainer.testing import drain_now
from tests.helpers import at, clean_env, count, run_cli, summary_of

EMOJI = "\N{GRINNING FACE}"
ESCAPED_EMOJI = "\\U0001f600"  # how a LATIN1 database keeps it in last_error


@dataclass
class Database:
    url: str
    encoding: str

    def holds(self, text: str) -> bool:
        return self.encoding == "UTF8" or all(ord(c) < 256 for c in text)


@pytest.fixture(params=["UTF8", "LATIN1"])
def database(request: pytest.FixtureRequest) -> Database:
    fixture = "db_url" if request.param == "UTF8" else "latin1_db_url"
    return Database(request.getfixturevalue(fixture), request.param)


def drain_default(conn: psycopg.Connection, handler) -> Summary:
    """One drain of queue `default`, batches of 10: a test's jobs share one batch."""
    return drain(conn, {"default": handler}, Options(queues=["default"], batch_size=10))


@pytest.mark.parametrize("text", ["café", f"smile {EMOJI}"])
def test_a_payload_reaches_its_handler_or_is_refused_whole(database, text):
    seen = []
    with connect(database.url) as conn:
        if not database.holds(text):
            with pytest.raises(BadInput, match="encoding"):
                drainer.enqueue(conn, "default", {"text": text})
            assert count(conn) == 0
            return
        drainer.enqueue(conn, "default", {"text": text})
        summary = drain_default(conn, lambda job: seen.append(job.payload))
        stored = conn.execute("SELECT payload->>'text' FROM jobs").fetchone()[0]
    assert seen == [{"text": text}] and stored == text
    assert (summary.done, summary.retried, summary.failed) == (1, 0, 0)


def test_a_payload_another_producer_wrote_reaches_its_handler(database):
    with psycopg.connect(database.url, autocommit=True) as producer:  # the server's encoding
        producer.execute("""INSERT INTO jobs (payload) VALUES ('{"text": "café"}')""")
    seen = []
    with connect(database.url) as conn:
        summary = drain_default(conn, lambda job: seen.append(job.payload))
    assert seen == [{"text": "café"}] and summary.done == 1


def test_claim_reads_payloads_in_the_connections_encoding(database):
    with psycopg.connect(database.url, autocommit=True) as conn:
        expected = "utf-8" if database.encoding == "UTF8" else "iso8859-1"
        assert conn.info.encoding == expected
        drainer.enqueue(conn, "default", {"text": "café"})
        jobs = drainer.claim(conn, ["default"], 10, timedelta(minutes=1))
    assert [job.payload for job in jobs] == [{"text": "café"}]


def test_an_unstorable_error_message_never_takes_its_batch_down(database):
    def handler(job):
        if job.payload.get("fail") == "emoji":
            raise RuntimeError(f"no {EMOJI} here")
        if job.payload.get("fail") == "long":  # cut to 2,000 characters with an ellipsis
            raise RuntimeError("x" * 3000)

    with connect(database.url) as conn:
        drainer.enqueue_many(conn, "default", [{}, {"fail": "emoji"}, {"fail": "long"}, {}])
        summary = drain_default(conn, handler)
        errors = dict(conn.execute("SELECT payload->>'fail', last_error FROM jobs "
                                   "WHERE last_error IS NOT NULL").fetchall())
        assert count(conn, "status = 'done'") == 2
    assert (summary.claimed, summary.done, summary.retried) == (4, 2, 2)
    utf8 = database.encoding == "UTF8"
    assert errors["emoji"] == f"RuntimeError: no {EMOJI if utf8 else ESCAPED_EMOJI} here"
    assert errors["long"].endswith("x…" if utf8 else "x\\u2026")


@pytest.mark.parametrize("opener", [connect, lambda url: psycopg.connect(url, autocommit=True)],
                         ids=["drainer-connection", "own-connection"])
def test_an_unstorable_payload_in_a_bulk_enqueue_writes_nothing(latin1_db_url, opener):
    with opener(latin1_db_url) as conn:
        with pytest.raises(BadInput, match="database's encoding"):
            drainer.enqueue_many(conn, "default", [{"text": "café"}, {"text": EMOJI}, {}])
        assert count(conn) == 0


def test_an_unstorable_payload_on_a_users_latin1_connection_is_bad_input(latin1_db_url):
    with psycopg.connect(latin1_db_url, autocommit=True) as conn:
        with pytest.raises(BadInput, match="database's encoding") as info:
            drainer.enqueue(conn, "default", {"text": EMOJI})
        assert count(conn) == 0
    assert info.value.exit_code == 2


def test_cli_enqueue_of_an_unstorable_character_is_one_line_and_exit_2(database):
    env = clean_env(DRAINER_DATABASE_URL=database.url)
    one = run_cli("enqueue", "default", json.dumps({"x": EMOJI}, ensure_ascii=False), env=env)
    bulk = run_cli("enqueue", "default", input=f'{{"x": "é"}}\n{{"x": "{EMOJI}"}}\n', env=env)
    with psycopg.connect(database.url) as conn:
        stored = count(conn)
    if database.holds(EMOJI):
        assert (one.returncode, bulk.returncode, stored) == (0, 0, 3), one.stderr + bulk.stderr
        return
    for proc in (one, bulk):
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "database's encoding" in proc.stderr and "Traceback" not in proc.stderr
    assert stored == 0


def test_a_sql_ascii_database_stores_and_delivers_any_text(server):
    """SQL_ASCII converts nothing: drainer's connections speak UTF-8 to it, so any
    text goes in and comes back as it was (in SQL_ASCII, psycopg would send ASCII)."""
    name = server.create_database(encoding="SQL_ASCII")
    seen = []
    try:
        with connect(server.url(name)) as conn:
            migrate(conn)
            drainer.enqueue(conn, "default", {"text": f"café {EMOJI}"})
            summary = drain_default(conn, lambda job: seen.append(job.payload))
    finally:
        server.drop_database(name)
    assert seen == [{"text": f"café {EMOJI}"}] and summary.done == 1


@pytest.mark.parametrize(("encoding", "expected"), [
    ("UTF8", f"é{EMOJI}…"),
    ("LATIN1", f"é{ESCAPED_EMOJI}\\u2026"),
    ("SQL_ASCII", f"é{EMOJI}…"),  # stores any bytes
])
def test_storable_escapes_only_what_the_server_cannot_hold(server, encoding, expected):
    name = server.create_database(encoding=encoding)
    try:
        with connect(server.url(name)) as conn:
            text = drainer_db.storable(f"é{EMOJI}…", conn)
            stored = conn.execute("SELECT %s::text", [text]).fetchone()[0]
    finally:
        server.drop_database(name)
    assert text == stored == expected


def _drain_in_transaction(conn: psycopg.Connection, task: drainer.Task) -> Summary:
    with conn.transaction():
        return drain_now(conn, handlers={"default": task}, in_transaction=True)


@pytest.mark.parametrize("drained", [
    lambda conn, task: drain(conn, {"default": task}, Options(["default"], batch_size=10)),
    _drain_in_transaction,
], ids=["drain", "in-transaction"])
def test_an_unstorable_result_fails_its_job_alone(database, drained):
    """Six kept results in one batch, one holding a character the database lacks: that
    job fails for good, as a result that is not JSON does; the other five are done."""
    def handler(job):
        return {"text": EMOJI if job.payload["n"] == 3 else "café", "n": job.payload["n"]}

    task = drainer.Task(handler, "default", keep_result=True)
    with connect(database.url) as conn:
        drainer.enqueue_many(conn, "default", [{"n": n} for n in range(6)])
        summary = drained(conn, task)
        rows = conn.execute("SELECT id, status, attempts, result, last_error FROM jobs "
                            "ORDER BY id").fetchall()
    assert len(rows) == 6
    unstorable = {3} if not database.holds(EMOJI) else set()
    for n, (_, status, attempts, result, error) in enumerate(rows):
        if n in unstorable:
            assert (status, attempts, result) == ("failed", 1, None)
            assert error == ("ValueError: the return value cannot be kept as the job's result "
                             "(keep_result=True): the database's encoding (LATIN1) cannot hold "
                             f"the character '{ESCAPED_EMOJI}' (U+1F600)")
        else:
            assert (status, attempts, error) == ("done", 1, None)
            assert result == {"text": EMOJI if n == 3 else "café", "n": n}
    assert (summary.claimed, summary.done, summary.failed, summary.retried) == (
        6, 6 - len(unstorable), len(unstorable), 0)


def test_an_unstorable_schedule_is_skipped_by_a_drain_and_refused_by_sync(latin1_db_url):
    """A drain of every queue logs an error naming the schedule and drains the rest;
    `schedules --sync`, a deploy step, exits 2 naming it."""
    env = clean_env(DRAINER_DATABASE_URL=latin1_db_url)
    with psycopg.connect(latin1_db_url, autocommit=True) as conn:
        drainer.enqueue(conn, "unrelated", {})
    drained = run_cli("drain", "--tasks", "smiling", env=env)
    assert drained.returncode == 0, drained.stderr
    assert summary_of(drained.stdout)["done"] == 1, drained.stderr
    [line] = [line for line in drained.stderr.splitlines() if "'smile'" in line]
    assert "skipped" in line and "LATIN1" in line and "payload" in line, line
    synced = run_cli("schedules", "--sync", "--tasks", "smiling", env=env)
    assert synced.returncode == 2, synced.stderr
    assert "schedule 'smile'" in synced.stderr and "LATIN1" in synced.stderr, synced.stderr
    assert "Traceback" not in synced.stderr
    with psycopg.connect(latin1_db_url, autocommit=True) as conn:
        stored = conn.execute("SELECT name FROM drainer_schedules ORDER BY name").fetchall()
        slots = conn.execute("SELECT queue, status FROM jobs ORDER BY queue").fetchall()
    assert stored == [("plain",)]
    assert slots == [("plain", "queued"), ("unrelated", "done")]


def test_a_stored_schedule_changed_to_what_cannot_be_stored_runs_as_stored(
        latin1_db_url, declared, caplog):
    """The slot queued by the stored definition runs; the changed one is skipped at the
    drain's start and after the slot ran, with an error naming it, and the drain's
    other work goes on."""
    with connect(latin1_db_url) as conn, at(datetime(2026, 6, 1, 12, 30, tzinfo=UTC)):
        schedules.reconcile(conn, [Schedule("s", "s", "@hourly")], ["s"],
                            now=clock.database_now())
        drainer.enqueue(conn, "other", {}, run_at=datetime(2026, 1, 1, tzinfo=UTC))
    changed = Schedule("s", "s", "@hourly", payload={"face": EMOJI})
    schedules.declare(changed)
    with connect(latin1_db_url) as conn, at(datetime(2026, 6, 1, 13, 0, 1, tzinfo=UTC)):
        summary = drain(conn, {"s": lambda job: None, "other": lambda job: None},
                        Options(["s", "other"]))
        slots = conn.execute("SELECT status, payload FROM jobs WHERE queue = 's'").fetchall()
    assert (summary.claimed, summary.done) == (2, 2)
    assert slots == [("done", {})]
    [error] = [r for r in caplog.records if "'s'" in r.getMessage()]
    assert error.levelno == logging.ERROR and "payload" in error.getMessage()
