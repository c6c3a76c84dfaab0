"""What the test modules share: drainer run as a real process and its output read,
waiting for what happens in another process or thread, skipping (or failing) for
want of a tool. Fixtures live in the conftest.py files; test modules import
helpers from here, never from one another."""

import argparse
import importlib
import json
import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import NoReturn, TypeVar

import freezegun
import psycopg
import pytest
from freezegun import freeze_time

import drainer
from drainer import clock
from drainer.commands.cli import build_parser
from drainer.commands.work import LISTEN_NAME
from drainer.storage import sql
from drainer.storage.sql import MIGRATIONS

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent

# What this run must not do without (comma-separated; CI sets it): a test that would
# skip for want of one fails instead, so a run cannot pass without that coverage.
# pgbouncer: the binary, for the transaction-pooler tests; matplotlib: the `bench`
# extra, for the simulator's chart; awslambdaric: AWS's runtime interface client, which
# runs the Lambda function as Lambda does; pg_stat_statements: preloaded by the server,
# for the tests that count statements; password: a server that asks a password over
# TCP (of tests.cluster's PASSWORD_ROLE), for the authentication tests; drivers:
# psycopg 2 and SQLAlchemy (with greenlet), for the other drivers' tests; django:
# Django (before 6 with the django-tasks backport), for its tests; browser: Debian's
# chromium and Playwright, for the dashboard's browser tests; pgNN (pg15, pg18):
# the session's server is that major version (the run really is on the PostgreSQL it
# is meant to be).
REQUIRE = frozenset(filter(None, (n.strip() for n in
                                  os.environ.get("DRAINER_TEST_REQUIRE", "").split(","))))
KNOWN = ("pgbouncer", "matplotlib", "awslambdaric", "pg_stat_statements", "password",
         "drivers", "django", "browser")
REQUIRABLE = re.compile("|".join([*KNOWN, r"pg\d+"]))

# The first migration: the jobs table and index as users made it by hand before
# `migrate` existed, which migrate and every command must still accept.
HAND_MADE_TABLE = MIGRATIONS[1]

# The options of every command that connects to the database.
DATABASE_OPTIONS = {"-h", "--help", "--database-url", "--no-prepare"}


def unavailable(name: str, why: str) -> NoReturn:
    """Skip the test for want of `name`, or fail it when DRAINER_TEST_REQUIRE names it.
    At a module's top, the whole module: skipped, or an error collecting it."""
    __tracebackhide__ = True  # report the test's line, not this one
    if name in REQUIRE:
        pytest.fail(f"{why} (DRAINER_TEST_REQUIRE={name})", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def require_module(module: str, name: str) -> ModuleType:
    """`module`, imported; `unavailable(name)` when it cannot be (pytest.importorskip,
    held to DRAINER_TEST_REQUIRE)."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{module} cannot be imported ({exc}); pip install -e '.[dev]'"
    unavailable(name, why)


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
    embedded default's ./.drainer/ (tests/commands/test_embedded_db.py)."""
    data = input.encode() if isinstance(input, str) else input
    proc = subprocess.run([sys.executable, "-m", "drainer", *args], input=data, cwd=cwd,
                          capture_output=True, env=env or clean_env(), timeout=timeout)
    proc.stdout = proc.stdout.decode(errors="replace")
    proc.stderr = proc.stderr.decode(errors="replace")
    return proc


def drainer_process(db_url: str, *args: str) -> subprocess.Popen:
    """`drainer drain` started in the background, for tests that signal it mid-run."""
    return subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", db_url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())


def summary_of(stdout: str) -> dict:
    """The run's summary: the JSON object a drain prints last."""
    return json.loads(stdout.strip().splitlines()[-1])


def offered(command: str) -> set[str]:
    """The options `drainer COMMAND` accepts, from its parser."""
    [subparsers] = [a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)]
    return {s for a in subparsers.choices[command]._actions for s in a.option_strings}


def read_until(proc: subprocess.Popen, marker: bytes, timeout: float = 60) -> bytes:
    """Stderr of a running process up to and including the line holding `marker`."""
    fd, seen = proc.stderr.fileno(), b""
    end = time.monotonic() + timeout
    while not (marker in seen and seen.endswith(b"\n")):
        left = end - time.monotonic()
        assert left > 0 and proc.poll() is None, (marker, seen)
        if select.select([fd], [], [], left)[0]:
            seen += os.read(fd, 4096)
    return seen


def with_modules(tmp_path: Path, **modules: str) -> dict[str, str]:
    """clean_env() with task modules written to `tmp_path` importable."""
    for name, source in modules.items():
        (tmp_path / f"{name}.py").write_text(source)
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return env


def schema_at(conn: psycopg.Connection, version: int) -> None:
    """The schema as `migrate` left it when `version` was the latest."""
    sql.run(conn, "migrate_version_table")
    for v in sorted(MIGRATIONS):
        if v <= version:
            conn.execute(MIGRATIONS[v], prepare=False)
            sql.run(conn, "record_version", {"version": v})


def count(conn: psycopg.Connection, where: str = "true") -> int:
    return conn.execute(f"SELECT count(*) FROM jobs WHERE {where}").fetchone()[0]


def enqueue_key(how: str, target: object, key: str) -> int:
    """The id of the job of queue mail holding `key`, through `target` (any connection
    enqueue takes) by drainer.enqueue ("enqueue") or a batch of one ("enqueue_many")."""
    if how == "enqueue":
        return drainer.enqueue(target, "mail", {}, key=key)
    [job] = drainer.enqueue_many(target, "mail", [{}], keys=[key])
    return job


def listeners(conn: psycopg.Connection) -> list[int]:
    """The backends of always-on workers listening on the test's database."""
    return [pid for (pid,) in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s AND query LIKE 'LISTEN jobs%%'", [LISTEN_NAME])]


def wait_until(check: Callable[[], T], timeout: float = 30) -> T:
    """Call `check` until it returns something true, and return that; AssertionError
    after `timeout` seconds. What another process or thread does takes its own time,
    which a fixed sleep would either waste or not wait long enough for."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout:g} s: {check}")
        time.sleep(0.02)
    return result


@contextmanager
def at(moment: datetime) -> Iterator[None]:
    """Python's clock and the database's (`drainer.clock.database_now`, where every
    statement's `now` comes from), both at `moment` (aware), in every thread: freezegun
    gives the real time to a call made near a thread's start (its default ignore list
    has `threading`), which would mix real and frozen monotonic times."""
    with freeze_time(moment), pytest.MonkeyPatch.context() as mp:
        mp.setattr(freezegun.api, "call_stack_inspection_limit", 0)
        mp.setattr(clock, "database_now", lambda: datetime.now(UTC))
        yield


@contextmanager
def limited_login(server, db_url: str, name: str, limit: int, *, setup: str = "",
                  member_of: str | None = None) -> Iterator[str]:
    """The URL of a login role `name` that takes at most `limit` sessions, in the test's
    database (after `setup` ran as the owner, in role `member_of`); its sessions ended
    and the role dropped afterwards, with `member_of` and its grants."""
    with psycopg.connect(db_url, autocommit=True) as owner:
        if setup:
            owner.execute(setup)
        owner.execute(f"DROP ROLE IF EXISTS {name}")
        owner.execute(f"CREATE ROLE {name} LOGIN CONNECTION LIMIT {limit}"
                      + (f" IN ROLE {member_of}" if member_of else ""))
    try:
        yield server.url(psycopg.conninfo.conninfo_to_dict(db_url)["dbname"], name)
    finally:
        with psycopg.connect(db_url, autocommit=True) as owner:
            owner.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE usename = %s", [name])
            if member_of:
                owner.execute(f"DROP OWNED BY {member_of}")
            owner.execute(f"DROP ROLE {name}")
            if member_of:
                owner.execute(f"DROP ROLE {member_of}")
