"""The database's session budget (drainer.storage.budget): what the server, the
login role and the database still take, read in one statement, and the share of it
a fleet of drains may use."""

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from drainer.db import connect
from drainer.storage.budget import Budget, session_budget
from tests.helpers import limited_login

LOGIN = "drainer_budget_login"


@pytest.fixture
def login_url(server, db_url) -> Iterator[str]:
    """A login role limited to 5 sessions, in the test's database."""
    with limited_login(server, db_url, LOGIN, 5) as url:
        yield url


def usable(conn: psycopg.Connection) -> int:
    """max_connections less the reserved slots, as this test reads them."""
    settings = dict(conn.execute(
        "SELECT name, setting::int FROM pg_settings WHERE name IN ('max_connections', "
        "'superuser_reserved_connections', 'reserved_connections')").fetchall())
    return (settings["max_connections"] - settings["superuser_reserved_connections"]
            - settings.get("reserved_connections", 0))


def test_the_role_and_the_database_limits_and_the_sessions_open(login_url, conn, db_url):
    dbname = conninfo_to_dict(db_url)["dbname"]
    conn.execute(f'ALTER DATABASE "{dbname}" CONNECTION LIMIT 40')
    with connect(login_url) as reader, connect(login_url), connect(login_url):
        found = session_budget(reader)
        total, in_db = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE datname = current_database()) "
            "FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchone()
    assert (found.usable, found.role_limit, found.database_limit) == (usable(conn), 5, 40)
    assert found.open_role == 3
    # Another role's session whose kind this role may not see (an autovacuum worker
    # at that moment) counts too: on the safe side.
    assert found.open >= total and found.open_database >= in_db
    assert found.free == 2  # the role's limit is the tightest: 5 less its 3
    # Half of what its 2 drains hold and the 2 free: 2 in all, so none more...
    assert found.more(running=2) == 0
    # ... and with no drain of its own among the 3, one more of the 2 free.
    assert found.more(running=0) == 1


def test_the_database_limit_when_it_is_the_tightest(conn, db_url):
    dbname = conninfo_to_dict(db_url)["dbname"]
    conn.execute(f'ALTER DATABASE "{dbname}" CONNECTION LIMIT 3')
    with connect(db_url) as reader:
        found = session_budget(reader)
    # A superuser is held to neither limit; a login would be.
    assert (found.role_limit, found.database_limit) == (None, None)
    assert found.free == usable(conn) - found.open


def test_no_limits_and_a_share_of_the_server(conn):
    found = session_budget(conn, share=1.0)
    assert found.free == usable(conn) - found.open > 0
    assert found.more() == found.free


def test_behind_a_pooler_the_pools_size_stands_for_the_server(conn):
    pooled = session_budget(conn, pool_size=20)
    assert pooled == Budget(pool=20)
    # Half the pool, less 4 drains running and 2 starting.
    assert pooled.more(running=4, pending=2) == 4
    assert pooled.more(running=10) == 0


@pytest.mark.parametrize(("budget", "running", "pending", "more"), [
    (Budget(usable=100, open=60), 0, 0, 20),  # half of the 40 free
    (Budget(usable=100, open=60), 10, 0, 15),  # half of 40 free and 10 held, less 10
    (Budget(usable=100, open=60), 10, 5, 10),
    (Budget(usable=100, open=100), 4, 0, 0),  # the server is full
    (Budget(usable=100, open=10, role_limit=8, open_role=6), 0, 0, 1),
    (Budget(usable=100, open=10, database_limit=12, open_database=2), 0, 0, 5),
    (Budget(usable=100, open=10, share=0.25), 0, 0, 22),
])
def test_the_share(budget, running, pending, more):
    assert budget.more(running, pending) == more
