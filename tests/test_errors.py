"""Driver errors become a short hierarchy whose messages say what to do, without passwords."""

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import errors
from drainer.db import connect
from drainer.storage import roundtrip
from tests.cluster import PASSWORD_ROLE, free_port
from tests.helpers import clean_env, run_cli, unavailable, wait_until

SECRET = "s3cr3t-Pa55"


def test_wrong_port_is_database_unavailable():
    with pytest.raises(errors.DatabaseUnavailable) as info:
        connect(f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/db", connect_timeout=2)
    assert "server is running" in str(info.value)
    assert SECRET not in str(info.value)
    assert info.value.exit_code == 3


def test_wrong_password_is_authentication_failed(server, db_url):
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'right-{SECRET}'")
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    url = server.url(dbname, PASSWORD_ROLE, SECRET)
    try:
        connect(url).close()
    except errors.AuthenticationFailed as exc:
        assert "password" in str(exc) and SECRET not in str(exc)
        assert exc.exit_code == 3
    else:
        unavailable("password", "this server does not ask for passwords over TCP")


def test_missing_table_is_schema_missing(empty_db_url):
    with connect(empty_db_url) as conn, pytest.raises(errors.SchemaMissing) as info:
        roundtrip.claim(conn, ["default"], 1, __import__("datetime").timedelta(seconds=1))
    assert "drainer migrate" in str(info.value)


def test_malformed_url_is_a_config_error():
    with pytest.raises(errors.ConfigError):
        connect("postgresql://u:p@host:notaport/db=x?bogus_option=1")


@pytest.mark.parametrize("text", [
    f"postgresql://user:{SECRET}@host/db",
    f"host=x password={SECRET} user=y",
    f"host=x password='{SECRET}' user=y",
])
def test_redact_masks_passwords(text):
    assert SECRET not in errors.redact(f"could not connect with {text}")


def test_redact_masks_a_known_password_anywhere():
    password = errors.password_of(f"postgresql://user:{SECRET}@host/db")
    assert password == SECRET
    assert errors.redact(f"role said {SECRET}!", password) == "role said ***!"


def dbname_of(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["dbname"]


def one_line_error(proc, code: int) -> str:
    """The CLI's single stderr line for an error that exits with `code`."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code and len(lines) == 1, proc.stderr
    assert lines[0].startswith("drainer: error: ")
    return lines[0]


@pytest.fixture
def read_only_db_url(server, db_url):
    """A database whose transactions are read-only by default, as on a hot standby."""
    with server.admin() as admin:
        admin.execute(f'ALTER DATABASE "{dbname_of(db_url)}" '
                      "SET default_transaction_read_only = on")
    return db_url


@pytest.mark.parametrize("args", [["enqueue", "default", "{}"], ["drain", "--tasks", "noop"]],
                         ids=["enqueue", "drain"])
def test_a_read_only_database_is_a_config_error(read_only_db_url, args):
    proc = run_cli(*args, env=clean_env(DRAINER_DATABASE_URL=read_only_db_url))
    line = one_line_error(proc, 2)
    assert "read-only" in line and "writable primary" in line
    assert "default_transaction_read_only" in line


@contextmanager
def jobs_locked(db_url: str) -> Iterator[None]:
    """Another session holds a lock on `jobs` that every statement on it waits for."""
    with psycopg.connect(db_url) as holder:  # its transaction stays open in the block
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        yield


@pytest.mark.parametrize("args", [["archive"], ["drain", "--tasks", "noop"]],
                         ids=["archive", "drain"])
def test_a_lock_timeout_is_a_cancelled_statement(server, db_url, args):
    with server.admin() as admin:
        admin.execute(f"ALTER DATABASE \"{dbname_of(db_url)}\" SET lock_timeout = '100ms'")
    with jobs_locked(db_url):
        proc = run_cli(*args, env=clean_env(DRAINER_DATABASE_URL=db_url))
    line = one_line_error(proc, 3)
    assert "cancelled" in line and "due to lock timeout" in line and "drainer doctor" in line
    assert "unavailable" not in line


def test_a_statement_timeout_is_a_cancelled_statement(db_url):
    with connect(db_url, statement_timeout=timedelta(milliseconds=100)) as conn, \
            jobs_locked(db_url), pytest.raises(errors.StatementCancelled) as info:
        roundtrip.claim(conn, ["default"], 1, timedelta(seconds=1))
    assert "due to statement timeout" in str(info.value) and info.value.exit_code == 3


def test_a_conflict_on_drainers_own_statement_is_a_conflict(conn, db_url):
    """A job cancelled after a REPEATABLE READ transaction's snapshot: cancelling it
    there is a serialization failure, which says to try again, not that the server
    is down."""
    job = drainer.enqueue(conn, "default", {})
    with psycopg.connect(db_url) as app:
        app.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        app.execute("SELECT 1")  # the snapshot
        drainer.cancel(conn, [job])
        with pytest.raises(errors.Conflict) as info:
            drainer.cancel(app, [job])
    assert str(info.value).startswith("conflict with another transaction, try again (")
    assert info.value.exit_code == 1
    assert isinstance(info.value.__cause__, psycopg.errors.SerializationFailure)


def test_the_cli_says_a_conflict_is_one_and_exits_1(server, conn, db_url):
    """`drainer enqueue` in a REPEATABLE READ database, its key taken by a transaction
    that commits while the insert waits for it: the application's driver's error,
    which enqueue lets through, said as a conflict."""
    with server.admin() as admin:
        admin.execute(f'ALTER DATABASE "{dbname_of(db_url)}" '
                      "SET default_transaction_isolation = 'repeatable read'")
    with psycopg.connect(db_url) as holder:
        drainer.enqueue(holder, "mail", {}, key="k")
        cli = subprocess.Popen(
            [sys.executable, "-m", "drainer", "enqueue", "mail", "{}", "--key", "k",
             "--database-url", db_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=clean_env())
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'").fetchone()[0] == 1)
    out, err = cli.communicate(timeout=60)  # the holder committed as its block ended
    line = one_line_error(subprocess.CompletedProcess(cli.args, cli.returncode, out, err), 1)
    assert line.startswith("drainer: error: conflict with another transaction, try again (")
    assert out == ""
