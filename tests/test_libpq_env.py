"""libpq's PG* variables fill what the URL leaves out: the drainer's own startup
settings (the statement timeout, its application_name) are merged with PGOPTIONS
and PGAPPNAME, never put in their place."""

import psycopg
import pytest

import drainer
from drainer.db import connect
from drainer.storage.schema import migrate
from tests.helpers import clean_env, run_cli, summary_of

APP_PATH = "-c search_path=app,public"


@pytest.fixture
def app_schema_url(empty_db_url: str) -> str:
    """A database whose `jobs` table lives in schema `app`, none in `public`."""
    with psycopg.connect(empty_db_url, autocommit=True, options="-c search_path=app") as conn:
        conn.execute("CREATE SCHEMA app")
        migrate(conn)
        drainer.enqueue_many(conn, "default", [{}] * 3)
    return empty_db_url


def setting(conn: psycopg.Connection, name: str) -> str:
    return conn.execute("SELECT current_setting(%s)", [name]).fetchone()[0]


@pytest.mark.parametrize("extra", [[], ["--no-prepare"]], ids=["prepared", "no-prepare"])
def test_a_drain_finds_jobs_by_the_search_path_of_pgoptions(app_schema_url, extra):
    env = clean_env(PGOPTIONS=APP_PATH, DRAINER_DATABASE_URL=app_schema_url)
    proc = run_cli("drain", "--tasks", "noop", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc.stdout)["done"] == 3
    with psycopg.connect(app_schema_url) as conn:
        tables = conn.execute("SELECT table_schema FROM information_schema.tables "
                              "WHERE table_name = 'jobs'").fetchall()
        done = conn.execute("SELECT count(*) FROM app.jobs WHERE status = 'done'").fetchone()[0]
    assert tables == [("app",)] and done == 3


def test_pgoptions_and_the_statement_timeout_are_both_applied(db_url, monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-c search_path=elsewhere,public -c work_mem=7MB")
    with connect(db_url) as conn:
        assert setting(conn, "search_path") == "elsewhere,public"
        assert setting(conn, "work_mem") == "7MB"
        assert setting(conn, "statement_timeout") == "30s"


def test_the_urls_options_win_over_pgoptions(db_url, monkeypatch):
    monkeypatch.setenv("PGOPTIONS", "-c work_mem=7MB")
    url = psycopg.conninfo.make_conninfo(db_url, options="-c work_mem=9MB")
    with connect(url) as conn:
        assert setting(conn, "work_mem") == "9MB"
        assert setting(conn, "statement_timeout") == "30s"


@pytest.mark.parametrize(("url_name", "env_name", "expected"), [
    (None, None, "drainer"),
    (None, "billing-worker", "billing-worker"),
    ("from-url", "billing-worker", "from-url"),
])
def test_application_name_is_the_urls_else_pgappname_else_ours(
        db_url, monkeypatch, url_name, env_name, expected):
    if env_name:
        monkeypatch.setenv("PGAPPNAME", env_name)
    else:
        monkeypatch.delenv("PGAPPNAME", raising=False)
    url = psycopg.conninfo.make_conninfo(db_url, application_name=url_name)
    with connect(url) as conn:
        assert setting(conn, "application_name") == expected
