"""Enqueue through the application's own connection, whatever its driver: psycopg 2
(connection and cursor), SQLAlchemy (Connection and Session, on psycopg 2 and 3),
Django (on psycopg 3 and 2), and asyncio's: psycopg 3's AsyncConnection, SQLAlchemy's
AsyncConnection and AsyncSession on it (enqueue_async, enqueue_many_async; asyncpg is
not needed). In each, a job enqueued in the app's transaction commits with the app's
row and rolls back with it; enqueue_many too. The keyed paths, options and errors
match psycopg 3's; a connection drainer cannot use is one clear error."""

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import drainer
from drainer.storage import enqueue
from tests.helpers import HAND_MADE_TABLE, clean_env, count, enqueue_key, require_module

psycopg2 = require_module("psycopg2", "drivers")
sqlalchemy = require_module("sqlalchemy", "drivers")

LEASE = timedelta(minutes=5)
ORDERS = "CREATE TABLE orders (note text NOT NULL)"
INSERT = "INSERT INTO orders (note) VALUES (%(note)s)"


@pytest.fixture
def orders(conn: psycopg.Connection) -> psycopg.Connection:
    """The app's own table, beside jobs; `conn` reads both afterwards."""
    conn.execute(ORDERS)
    return conn


def enqueue_all(target: object, note: str) -> None:
    """What the app enqueues with its row: two jobs in bulk, then one."""
    assert drainer.enqueue_many(target, "mail", [{"note": note}, {"note": note}]) == 2
    drainer.enqueue(target, "mail", {"note": note})


def assert_only_kept(conn: psycopg.Connection) -> None:
    """The committed transaction's row and three jobs are there; nothing of the one
    rolled back."""
    assert [n for (n,) in conn.execute("SELECT note FROM orders")] == ["kept"]
    notes = [n for (n,) in conn.execute(
        "SELECT payload->>'note' FROM jobs WHERE queue = 'mail' ORDER BY id")]
    assert notes == ["kept"] * 3


def both_ways(run: Callable[[str, bool], None]) -> None:
    """`run(note, commit)`: the app's transaction, committed, then one rolled back."""
    run("kept", True)
    run("lost", False)


# psycopg 2


@pytest.fixture
def pg2(db_url: str) -> Iterator[Any]:
    connection = psycopg2.connect(db_url)
    yield connection
    connection.close()


@pytest.mark.parametrize("through", ["connection", "cursor"])
def test_psycopg2_jobs_commit_and_roll_back_with_the_apps_row(orders, pg2, through):
    def run(note: str, commit: bool) -> None:
        with pg2.cursor() as cursor:
            enqueue_all(cursor if through == "cursor" else pg2, note)  # first in the transaction
            cursor.execute(INSERT, {"note": note})
        pg2.commit() if commit else pg2.rollback()

    both_ways(run)
    assert_only_kept(orders)


def test_psycopg2_in_autocommit_commits_at_once_and_bulk_is_all_or_nothing(conn, pg2):
    pg2.autocommit = True
    drainer.enqueue(pg2, "mail", {})
    assert drainer.enqueue_many(pg2, "mail", [{}] * 3) == 3
    with pytest.raises(drainer.BadInput, match="payload 2"):
        drainer.enqueue_many(pg2, "mail", [{}, {"x": float("nan")}, {}])
    with pytest.raises(drainer.BadInput, match="refused the value"):  # by the database
        drainer.enqueue_many(pg2, "mail", [{}, {}], max_attempts=2**40)
    assert pg2.autocommit and drainer.enqueue_many(pg2, "mail", []) == 0
    assert count(conn) == 4


def test_psycopg2_bulk_enqueue_on_a_table_made_by_hand(empty_db_url):
    """No COPY through psycopg 2: the bulk insert needs only the hand-made columns,
    unless a priority or group asks for more."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        with psycopg2.connect(empty_db_url) as pg2:
            assert drainer.enqueue_many(pg2, "mail", [{"n": 1}, {"n": 2}], max_attempts=3) == 2
            with pytest.raises(drainer.ConfigError, match="run `drainer migrate`"):
                drainer.enqueue_many(pg2, "mail", [{}], priority=1)
        rows = conn.execute("SELECT payload, max_attempts FROM jobs ORDER BY id").fetchall()
        assert rows == [({"n": 1}, 3), ({"n": 2}, 3)]


def test_keys_replace_and_priorities_through_psycopg2(conn, pg2):
    """The keyed paths through a driver without pipeline or COPY: the replace's
    savepoint, the batch's undo of a held key (its unique violation translated), the
    holders; all in the caller's transaction."""
    held = drainer.enqueue(conn, "mail", {"v": "held"}, key="h")  # committed
    with pg2:  # psycopg 2: one transaction, committed at the end of the block
        first = drainer.enqueue(pg2, "mail", {"v": 1}, key="k", priority=7)
        assert drainer.enqueue(pg2, "mail", {"v": 2}, key="k") == first
        done = enqueue.enqueue_keyed(pg2, "mail", {"v": 3}, key="k", replace=True, priority=9)
        assert done == (first, "replaced")
        ids = drainer.enqueue_many(pg2, "mail", [{"n": 1}, {"n": 2}, {"n": 3}],
                                   keys=["a", "h", "a"], priority=-5)
        assert ids[0] == ids[2] and ids[1] == held
    rows = dict(conn.execute("SELECT id, (payload, priority)::text FROM jobs").fetchall())
    assert rows[first] == '("{""v"": 3}",9)' and rows[ids[0]] == '("{""n"": 1}",-5)'
    assert count(conn) == 3
    [job] = drainer.claim(conn, ["mail"], 1, LEASE)  # the highest priority: "k"
    with pg2:  # a running holder is left as it was, its row not kept locked
        assert enqueue.enqueue_keyed(pg2, "mail", {"v": 4}, key="k", replace=True) == (
            first, "running")
        conn.execute("SET lock_timeout = '2s'")
        assert drainer.complete(conn, [job]) == {first}


def test_a_value_the_database_refuses_through_psycopg2_is_bad_input(conn, pg2):
    with pytest.raises(drainer.BadInput, match="refused the value") as caught:
        drainer.enqueue(pg2, "mail", {}, max_attempts=2**40)
    assert isinstance(caught.value.__cause__, psycopg.errors.NumericValueOutOfRange)
    assert type(caught.value.__cause__.__cause__).__module__.startswith("psycopg2")
    pg2.rollback()
    assert count(conn) == 0


# A conflict: the app's REPEATABLE READ transaction takes its snapshot, then another
# commits a job holding a key, which the app's enqueue of the key cannot see.
CONFLICTING = ("enqueue", "enqueue_many")


def test_a_conflict_through_psycopg2_is_psycopg2s_own_error(conn, pg2):
    import psycopg2.errors

    pg2.set_session(isolation_level="REPEATABLE READ")
    for how in CONFLICTING:
        pg2.cursor().execute("SELECT 1")  # the snapshot
        enqueue_key("enqueue", conn, how)
        with pytest.raises(psycopg2.errors.SerializationFailure):
            enqueue_key(how, pg2, how)
        pg2.rollback()
    assert count(conn) == 2


def test_connections_whose_rows_are_dicts(conn, db_url):
    """The app's row factory is its own: drainer reads its rows as tuples whatever it is."""
    from psycopg.rows import dict_row
    from psycopg2.extras import RealDictCursor

    with psycopg2.connect(db_url, cursor_factory=RealDictCursor) as pg2, psycopg.connect(
            db_url, row_factory=dict_row) as pg3:
        for app in (pg2, pg3):
            key = type(app).__module__
            job = drainer.enqueue(app, "mail", {}, key=key, priority=1)
            assert drainer.enqueue(app, "mail", {}, key=key) == job
            assert drainer.enqueue_many(app, "mail", [{}], keys=[key]) == [job]
    assert count(conn) == 2


# SQLAlchemy, sync, on psycopg 2 and psycopg 3


def sqlalchemy_url(db_url: str, dialect: str) -> Any:
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    return sqlalchemy.engine.URL.create(
        f"postgresql+{dialect}", username=info.get("user"), password=info.get("password"),
        host=info.get("host"), port=int(info["port"]) if info.get("port") else None,
        database=info.get("dbname"))


@pytest.fixture(params=["psycopg2", "psycopg"])
def engine(request: pytest.FixtureRequest, db_url: str) -> Iterator[Any]:
    made = sqlalchemy.create_engine(sqlalchemy_url(db_url, request.param))
    yield made
    made.dispose()


def test_sqlalchemy_connection_jobs_commit_and_roll_back_with_the_apps_row(orders, engine):
    with engine.connect() as connection:
        def run(note: str, commit: bool) -> None:
            enqueue_all(connection, note)  # begins the Connection's transaction, as execute does
            connection.execute(sqlalchemy.text("INSERT INTO orders VALUES (:note)"), {"note": note})
            connection.commit() if commit else connection.rollback()

        both_ways(run)
    assert_only_kept(orders)


def test_sqlalchemy_session_jobs_commit_and_roll_back_with_the_apps_row(orders, engine):
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        def run(note: str, commit: bool) -> None:
            session.execute(sqlalchemy.text("INSERT INTO orders VALUES (:note)"), {"note": note})
            enqueue_all(session, note)
            session.commit() if commit else session.rollback()

        both_ways(run)
    assert_only_kept(orders)


def test_a_conflict_through_sqlalchemy_is_sqlalchemys_error_of_the_drivers(conn, engine):
    """As SQLAlchemy raises it for its own statements: its OperationalError, the
    driver's SerializationFailure as `orig`."""
    from sqlalchemy.orm import Session

    driver = {"psycopg": psycopg.errors, "psycopg2": pytest.importorskip("psycopg2.errors")}[
        engine.dialect.driver]
    rr = engine.execution_options(isolation_level="REPEATABLE READ")
    with rr.connect() as connection, Session(rr) as session:
        for app in (connection, session):
            for how in CONFLICTING:
                app.execute(sqlalchemy.text("SELECT 1"))  # the snapshot
                key = f"{type(app).__name__} {how}"
                enqueue_key("enqueue", conn, key)
                with pytest.raises(sqlalchemy.exc.OperationalError) as caught:
                    enqueue_key(how, app, key)
                assert isinstance(caught.value.orig, driver.SerializationFailure)
                app.rollback()


def test_a_sqlalchemy_connection_enqueue_alone_is_committed_by_its_commit(conn, engine):
    """No statement of the app's before it: the job begins the Connection's
    transaction, so the app's commit() commits it (and closing would roll it back)."""
    with engine.connect() as connection:
        drainer.enqueue(connection, "mail", {})
        connection.commit()
        drainer.enqueue_many(connection, "mail", [{}, {}], keys=["a", "b"])
    assert count(conn) == 1


# Django, on psycopg 3 and psycopg 2, each in a process of its own (its settings and
# its choice of driver are made once per process)

DJANGO_SETUP = """
import json, sys
url, driver = sys.argv[1], sys.argv[2]
if driver == "psycopg2":  # Django's backend takes psycopg 2 when psycopg 3 is not importable
    sys.modules["psycopg"] = None
    import django.db.backends.postgresql.base
    del sys.modules["psycopg"]
import django, psycopg
from django.conf import settings

info = psycopg.conninfo.conninfo_to_dict(url)
settings.configure(DATABASES={"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": info["dbname"],
    "USER": info.get("user", ""), "PASSWORD": info.get("password", ""),
    "HOST": info.get("host", ""), "PORT": info.get("port", "")}})
django.setup()
from django.db import connection, transaction
import drainer
"""

DJANGO_APP = DJANGO_SETUP + """
class Undo(Exception):
    pass

def app(note):  # the app's row and its jobs, enqueue_many first in the block
    assert drainer.enqueue_many(connection, "mail", [{"note": note}] * 2) == 2
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (note) VALUES (%s)", [note])
    drainer.enqueue(connection, "mail", {"note": note})

with transaction.atomic():
    app("kept")
try:
    with transaction.atomic():
        app("lost")
        raise Undo
except Undo:
    pass
outside = drainer.enqueue(connection, "alone", {})  # autocommit, as Django's own statements
keyed = drainer.enqueue_many(connection, "alone", [{}, {}], keys=["a", "a"], priority=2)
print(json.dumps({"driver": type(connection.connection).__module__,
                  "outside": outside, "keyed": keyed}))
"""


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_django_jobs_commit_and_roll_back_with_the_apps_row(orders, db_url, driver):
    require_module("django", "django")
    proc = subprocess.run([sys.executable, "-c", DJANGO_APP, db_url, driver], text=True,
                          capture_output=True, env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["driver"].split(".")[0] == driver  # the driver Django runs on
    assert_only_kept(orders)
    assert seen["keyed"][0] == seen["keyed"][1] != seen["outside"]
    assert count(orders, "queue = 'alone'") == 2


DJANGO_CONFLICT = DJANGO_SETUP + """
from django.db import OperationalError

seen = {}
with psycopg.connect(url, autocommit=True) as other:
    for key in ("enqueue", "enqueue_many"):
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    cursor.execute("SELECT 1")
                drainer.enqueue(other, "mail", {}, key=key)
                if key == "enqueue":
                    drainer.enqueue(connection, "mail", {}, key=key)
                else:
                    drainer.enqueue_many(connection, "mail", [{}], keys=[key])
        except OperationalError as exc:
            cause = type(exc.__cause__)
            seen[key] = [type(exc).__module__, cause.__module__, cause.__name__]
print(json.dumps(seen))
"""


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_a_conflict_through_django_is_djangos_error_of_the_drivers(conn, db_url, driver):
    """As Django raises it for its own statements: its OperationalError, caused by the
    driver's SerializationFailure."""
    pytest.importorskip("django")
    proc = subprocess.run([sys.executable, "-c", DJANGO_CONFLICT, db_url, driver], text=True,
                          capture_output=True, env=clean_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = ["django.db.utils", f"{driver}.errors", "SerializationFailure"]
    assert json.loads(proc.stdout) == {"enqueue": expected, "enqueue_many": expected}


# psycopg 3 itself, outside autocommit


def test_psycopg3_bulk_enqueue_as_the_transactions_first_statement_rolls_back(orders, db_url):
    """A connection outside autocommit whose transaction has not begun: the batch
    joins the transaction the app then rolls back (psycopg's own transaction() would
    have committed it apart)."""
    with psycopg.connect(db_url) as app:
        enqueue_all(app, "kept")
        app.execute(INSERT, {"note": "kept"})
        app.commit()
        enqueue_all(app, "lost")  # features known by now: the batch is the first statement
        app.execute(INSERT, {"note": "lost"})
        app.rollback()
    assert_only_kept(orders)


# what drainer cannot use


def test_a_connection_drainer_cannot_use_is_one_clear_error(db_url):
    for unusable in (sqlite3.connect(":memory:"), sqlite3.connect(":memory:").cursor(), object()):
        with pytest.raises(drainer.ConfigError, match="drainer cannot enqueue through") as caught:
            drainer.enqueue(unusable, "mail", {})
        assert "\n" not in str(caught.value) and "psycopg" in str(caught.value)
        with pytest.raises(drainer.ConfigError, match="cannot enqueue through"):
            drainer.enqueue_many(unusable, "mail", [{}])


# asyncio: enqueue_async and enqueue_many_async


async def enqueue_all_async(target: object, note: str) -> None:
    """What the app enqueues with its row: two jobs in bulk (COPY), then one."""
    payloads = [{"note": note}, {"note": note}]
    assert await drainer.enqueue_many_async(target, "mail", payloads) == 2
    await drainer.enqueue_async(target, "mail", {"note": note})


async def both_ways_async(transact: Callable[[str, bool], Awaitable[None]]) -> None:
    await transact("kept", True)
    await transact("lost", False)


def test_async_psycopg_jobs_commit_and_roll_back_with_the_apps_row(orders, db_url):
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as app:
            async def transact(note: str, commit: bool) -> None:
                await enqueue_all_async(app, note)  # the transaction's first statements
                await app.execute(INSERT, {"note": note})
                await (app.commit() if commit else app.rollback())

            await both_ways_async(transact)

    asyncio.run(scenario())
    assert_only_kept(orders)


def test_async_options_results_and_errors_match_the_sync_functions(conn, db_url):
    async def scenario() -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as app:
            seen: dict[str, Any] = {"held": await drainer.enqueue_async(app, "mail", {}, key="h")}
            async with app.transaction():  # replace in a transaction: its savepoint
                seen["k"] = await drainer.enqueue_async(app, "mail", {"v": 1}, key="k",
                                                        priority=7, max_attempts=2)
                assert await drainer.enqueue_async(app, "mail", {"v": 2}, key="k",
                                                   replace=True, priority=9) == seen["k"]
                seen["ids"] = await drainer.enqueue_many_async(
                    app, "mail", [{"n": 1}, {"n": 2}, {"n": 1}], keys=["a", "h", "a"],
                    priority=-5, delay=60)
            seen["later"] = await drainer.enqueue_async(
                app, "later", {}, run_at=datetime(2100, 1, 1, tzinfo=UTC))
            assert await drainer.enqueue_many_async(app, "later", [{}], delay=3600,
                                                    priority=3) == 1
            with pytest.raises(drainer.BadInput, match="run_at or delay"):
                await drainer.enqueue_async(app, "mail", {}, delay=1, run_at=datetime.now(UTC))
            with pytest.raises(drainer.BadInput, match="payload 2"):
                await drainer.enqueue_many_async(app, "mail", [{}, {"x": float("inf")}])
            with pytest.raises(drainer.BadInput, match="refused the value"):
                await drainer.enqueue_many_async(app, "mail", [{}], max_attempts=2**40)
            with pytest.raises(drainer.BadInput, match="priority"):
                await drainer.enqueue_async(app, "mail", {}, priority=101)
            return seen

    seen = asyncio.run(scenario())
    ids = seen["ids"]
    assert ids[0] == ids[2] and ids[1] == seen["held"]
    rows = dict(conn.execute("SELECT id, (payload, priority, max_attempts)::text FROM jobs"))
    assert rows[seen["k"]] == '("{""v"": 2}",9,2)' and rows[ids[0]] == '("{""n"": 1}",-5,5)'
    assert count(conn, "run_at > now() + interval '59 seconds'") == 3  # the batch, later's two
    assert count(conn) == 5


def test_an_async_replace_leaves_a_running_holder_unlocked(conn, db_url):
    held = drainer.enqueue(conn, "mail", {"v": 1}, key="k")
    [job] = drainer.claim(conn, ["mail"], 1, LEASE)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as app:
            assert await drainer.enqueue_async(app, "mail", {"v": 2}, key="k",
                                               replace=True) == held
            conn.execute("SET lock_timeout = '2s'")
            assert drainer.complete(conn, [job]) == {held}  # the caller holds no lock on it
            await app.commit()

    asyncio.run(scenario())


def test_async_keys_on_a_table_without_them_say_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(empty_db_url) as app:
            await drainer.enqueue_async(app, "mail", {})
            assert await drainer.enqueue_many_async(app, "mail", [{}, {}]) == 2  # COPY
            with pytest.raises(drainer.ConfigError, match="run `drainer migrate`"):
                await drainer.enqueue_async(app, "mail", {}, key="k")
            with pytest.raises(drainer.ConfigError, match="run `drainer migrate`"):
                await drainer.enqueue_many_async(app, "mail", [{}], priority=1)
            await app.commit()  # the transaction was not aborted

    asyncio.run(scenario())
    with psycopg.connect(empty_db_url) as conn:
        assert count(conn) == 3


def test_task_objects_enqueue_asynchronously_with_their_defaults(conn, db_url):
    send = drainer.Task(lambda job: None, "invoices", max_attempts=9)

    async def scenario() -> list[int]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as app:
            one = await send.enqueue_async(app, {"invoice": 7}, key="invoice:7")
            many = await send.enqueue_many_async(app, [{}, {}], keys=["invoice:7", "x"])
            assert isinstance(many, list) and many[0] == one
            assert await send.enqueue_many_async(app, [{}], max_attempts=2) == 1
            return many

    asyncio.run(scenario())
    assert count(conn, "queue = 'invoices' AND max_attempts = 9") == 2
    assert count(conn, "max_attempts = 2") == 1


# SQLAlchemy's asyncio API, on psycopg 3


@pytest.fixture
def async_engine(db_url: str) -> Any:
    asyncio_api = require_module("sqlalchemy.ext.asyncio", "drivers")
    require_module("greenlet", "drivers")  # SQLAlchemy's asyncio API runs on it
    return asyncio_api.create_async_engine(sqlalchemy_url(db_url, "psycopg"))


def test_sqlalchemy_async_connection_jobs_commit_and_roll_back(orders, async_engine):
    from sqlalchemy import text

    async def scenario() -> None:
        async with async_engine.connect() as connection:
            async def transact(note: str, commit: bool) -> None:
                await enqueue_all_async(connection, note)  # begins its transaction, as execute does
                await connection.execute(text("INSERT INTO orders VALUES (:n)"), {"n": note})
                await (connection.commit() if commit else connection.rollback())

            await both_ways_async(transact)
            await drainer.enqueue_async(connection, "alone", {})  # alone: begins, commits
            await connection.commit()
        await async_engine.dispose()

    asyncio.run(scenario())
    assert_only_kept(orders)
    assert count(orders, "queue = 'alone'") == 1


def test_sqlalchemy_async_session_jobs_commit_and_roll_back(orders, async_engine):
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import AsyncSession

    async def scenario() -> None:
        async with AsyncSession(async_engine) as session:
            async def transact(note: str, commit: bool) -> None:
                await session.execute(text("INSERT INTO orders VALUES (:n)"), {"n": note})
                await enqueue_all_async(session, note)
                ids = await drainer.enqueue_many_async(session, "keyed", [{}, {}],
                                                       keys=[note, note])
                assert ids[0] == ids[1]
                await (session.commit() if commit else session.rollback())

            await both_ways_async(transact)
        await async_engine.dispose()

    asyncio.run(scenario())
    assert_only_kept(orders)
    assert count(orders, "queue = 'keyed'") == 1


def test_a_conflict_through_asyncio_connections_is_their_drivers_error(conn, db_url,
                                                                       async_engine):
    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(db_url) as app:
            await app.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            await app.execute("SELECT 1")  # the snapshot
            enqueue_key("enqueue", conn, "psycopg")
            with pytest.raises(psycopg.errors.SerializationFailure):
                await drainer.enqueue_many_async(app, "mail", [{}], keys=["psycopg"])
        rr = async_engine.execution_options(isolation_level="REPEATABLE READ")
        async with rr.connect() as connection:
            await connection.execute(sqlalchemy.text("SELECT 1"))
            enqueue_key("enqueue", conn, "sqlalchemy")
            with pytest.raises(sqlalchemy.exc.OperationalError) as caught:
                await drainer.enqueue_async(connection, "mail", {}, key="sqlalchemy")
            assert isinstance(caught.value.orig, psycopg.errors.SerializationFailure)
        await async_engine.dispose()

    asyncio.run(scenario())


# what the async functions cannot use, and the sync ones


def test_sync_and_async_connections_are_refused_by_the_other_kind(db_url):
    async def scenario() -> None:
        with psycopg.connect(db_url) as sync, pytest.raises(
                drainer.ConfigError, match="synchronous: call drainer.enqueue"):
            await drainer.enqueue_async(sync, "mail", {})
        async with await psycopg.AsyncConnection.connect(db_url) as app:
            with pytest.raises(drainer.ConfigError, match="await drainer.enqueue_async"):
                drainer.enqueue(app, "mail", {})
            with pytest.raises(drainer.ConfigError, match="await drainer.enqueue_async"):
                drainer.enqueue_many(app.cursor(), "mail", [{}])
        with pytest.raises(drainer.ConfigError, match="cannot enqueue asynchronously"):
            await drainer.enqueue_many_async(object(), "mail", [{}])

    asyncio.run(scenario())


def test_a_naive_run_at_is_bad_input_whatever_the_connection(conn, pg2, engine, db_url):
    # The database would read it in the session's time zone: on a server in New York,
    # "UTC now + 10 minutes" became a job due hours later.
    naive = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=10)
    conn.execute("SET TimeZone = 'America/New_York'")
    task = drainer.Task(lambda job: None, "mail")
    enqueues: list[Callable[[], object]] = [
        lambda: drainer.enqueue(conn, "mail", {}, run_at=naive),
        lambda: drainer.enqueue(conn, "mail", {}, run_at=naive, key="k", priority=1),
        lambda: drainer.enqueue_many(conn, "mail", [{}, {}], run_at=naive),
        lambda: task.enqueue(conn, {}, run_at=naive),
        lambda: task.enqueue_many(conn, [{}], run_at=naive),
        lambda: drainer.enqueue(pg2, "mail", {}, run_at=naive),
        lambda: drainer.enqueue_many(pg2.cursor(), "mail", [{}], run_at=naive),
    ]
    for call in enqueues:
        with pytest.raises(drainer.BadInput, match="has no time zone"):
            call()
    with engine.connect() as app, pytest.raises(drainer.BadInput, match="has no time zone"):
        drainer.enqueue(app, "mail", {}, run_at=naive)

    async def asynchronously() -> None:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as app:
            with pytest.raises(drainer.BadInput, match="has no time zone"):
                await drainer.enqueue_async(app, "mail", {}, run_at=naive)
            with pytest.raises(drainer.BadInput, match="has no time zone"):
                await task.enqueue_many_async(app, [{}], run_at=naive)

    asyncio.run(asynchronously())
    pg2.commit()
    assert count(conn) == 0
    # An aware one is stored as the moment it names, whatever the session's zone.
    job = drainer.enqueue(conn, "mail", {}, run_at=naive.replace(tzinfo=UTC))
    assert conn.execute("SELECT run_at FROM jobs WHERE id = %s", (job,)).fetchone() == (
        naive.replace(tzinfo=UTC),)
