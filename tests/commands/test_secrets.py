"""No password ever shows: every command the CLI has, and its errors (wrong password,
wrong port, bad URL, no such database, missing schema), run as real processes with a
URL, a variable or PGPASSWORD holding a known password; every byte of their stdout
and stderr is searched for it, as given and as the URL spells it. A handler's error
that quotes the URL is stored with the password masked."""

import json
import urllib.parse
from collections.abc import Iterator

import psycopg
import pytest

from drainer.commands.cli import COMMANDS
from tests.cluster import PASSWORD_ROLE, free_port
from tests.helpers import clean_env, run_cli

SECRET = "Pw-7f3a9c:s@cr/t%"  # characters a URL must percent-encode
SPELLINGS = (SECRET, urllib.parse.quote(SECRET, safe=""), urllib.parse.quote(SECRET))


def url(server, dbname: str, password: str = SECRET, port: int | str | None = None) -> str:
    info = psycopg.conninfo.conninfo_to_dict(server.admin_url)
    quoted = urllib.parse.quote(password, safe="")
    return (f"postgresql://{PASSWORD_ROLE}:{quoted}@{info.get('host', '127.0.0.1')}:"
            f"{port or info.get('port', 5432)}/{dbname}")


@pytest.fixture
def owned_db(server) -> Iterator[str]:
    """A fresh, empty database owned by the password role (so it can migrate)."""
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psycopg.sql.Identifier(PASSWORD_ROLE), SECRET))
    name = server.create_database()
    with server.admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" OWNER TO {PASSWORD_ROLE}')
    yield name
    server.drop_database(name)
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")


class Runs:
    """Every run of the test, so that all their outputs can be searched at the end."""

    def __init__(self):
        self.outputs: list[tuple[list[str], int, str]] = []

    def __call__(self, *args: str, expect: int | tuple[int, ...] = 0, env: dict | None = None,
                 input: bytes | None = None) -> str:
        result = run_cli(*args, env=env, input=input)
        self.outputs.append((list(args), result.returncode, result.stdout + result.stderr))
        allowed = expect if isinstance(expect, tuple) else (expect,)
        assert result.returncode in allowed, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        return result.stdout


def test_no_command_and_no_error_shows_the_password(server, owned_db, tmp_path):
    good = url(server, owned_db)
    run = Runs()
    db = ["--database-url", good]
    run("migrate", *db)
    run("migrate", *db)  # already current
    run("enqueue", "default", '{"sleep": 0}', *db)
    run("enqueue", "default", '{"fail": "planned failure"}', "--max-attempts", "1", *db)
    run("enqueue", "default", *db, input=b'{"n": 1}\n{"n": 2}\n')
    run("enqueue", "default", *db, input=b'{"n": 1}\nnot json\n', expect=2)
    run("drain", *db, "--tasks", "behave")
    run("drain", *db, "--tasks", "behave", "--queue", "nope", expect=2)
    run("drain", *db, expect=2)  # no tasks
    run("drain", "--tasks", "leaky", env=clean_env(DATABASE_URL=good), expect=2)
    run("enqueue", "default", json.dumps({"fail": f"cannot reach {good}"}), *db)
    for command in (["stats"], ["stats", "--json"], ["reap"], ["archive"],
                    ["requeue", "--queue", "default"], ["cancel", "1"]):
        run(*command, *db)
    if "doctor" in COMMANDS:  # a problem found exits 1: the output is what matters here
        run("doctor", *db, expect=(0, 1))
        run("doctor", "--json", *db, expect=(0, 1))
    if "work" in COMMANDS:
        run("work", *db, "--tasks", "behave", "--max-runtime", "3")
    # The same through the environment, and libpq's PGPASSWORD with no password in the URL.
    run("drain", "--tasks", "behave", "--verbose", env=clean_env(DATABASE_URL=good))
    run("stats", env=clean_env(DRAINER_DATABASE_URL=good))
    # The failures seen: the handler's error above quotes the URL.
    failed = json.loads(run("failed", "--json", *db))["jobs"]
    run("failed", *db)
    run("show", str(failed[0]["id"]), *db)
    run("show", str(failed[0]["id"]), "--json", *db)
    run("show", "999999", *db, expect=1)
    no_password = good.replace(f":{urllib.parse.quote(SECRET, safe='')}@", "@")
    assert SECRET not in no_password
    run("stats", "--database-url", no_password, env=clean_env(PGPASSWORD=SECRET))

    # Errors: each carries the password somewhere in what the user gave. argparse
    # quotes what it does not understand: a URL given as an argument, a misspelt flag.
    run("stats", good, expect=2)
    run("drain", "--tasks", "behave", f"--database-ur1={good}", expect=2)
    wrong = "wrong-" + SECRET
    run("drain", "--tasks", "behave", "--database-url", url(server, owned_db, password=wrong),
        expect=3)
    run("stats", "--database-url", no_password, env=clean_env(PGPASSWORD=wrong), expect=3)
    run("enqueue", "q", "{}", "--database-url", url(server, owned_db, port=free_port()),
        expect=3)
    run("migrate", "--database-url", url(server, "no_such_database"), expect=3)
    run("stats", "--database-url", good.replace(owned_db, "no_such_database"), expect=3)
    run("enqueue", "q", "{}", "--database-url", good + "?sslmode=bogus", expect=2)
    run("enqueue", "q", "{}", "--database-url", good + "?bogus_option=1", expect=2)
    run("drain", "--tasks", "behave", "--database-url", url(server, owned_db, port="x1"),
        expect=2)
    run("stats", "--database-url", f"host=127.0.0.1 password={SECRET} port=notaport",
        expect=2)
    unencoded = f"postgresql://{PASSWORD_ROLE}:{SECRET}@127.0.0.1:{free_port()}/db"
    run("stats", "--database-url", unencoded, expect=(2, 3))  # libpq may read it, or not
    run("drain", "--tasks", "behave", "--database-url", good, "--lease", "nope", expect=2)
    run("drain", "--tasks", "behave", env=clean_env(DATABASE_URL=good, DRAINER_LEASE="-1"),
        expect=2)

    with psycopg.connect(good, autocommit=True) as conn:
        errors = [e for (e,) in conn.execute("SELECT last_error FROM jobs WHERE last_error "
                                             "LIKE 'RuntimeError: cannot reach%'")]
        assert errors and not any(s in e for e in errors for s in SPELLINGS)
        conn.execute("DROP TABLE jobs CASCADE")
    run("drain", "--tasks", "behave", *db, expect=3)  # schema missing

    assert len(run.outputs) > 30
    for args, code, output in run.outputs:
        for spelling in SPELLINGS:
            assert spelling not in output, (args, code, output)
