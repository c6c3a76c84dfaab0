"""The application's own connection, whatever its driver, as enqueue needs it.

A job must commit and roll back with the caller's data, so `enqueue` speaks through
the caller's connection, in its transaction: psycopg 3's (sync or asyncio), psycopg
2's, SQLAlchemy's Connection or Session (sync or asyncio: the DB-API connection
underneath, in their transaction), Django's `django.db.connection`. Each becomes a
`Db`, which sends drainer's named statements as `queries/` writes them, through the
gateway (`sql`) and the driver's adapter (`adapters`): both psycopgs take its
`%(name)s` placeholders. None of those libraries is imported: they
are recognised by what they have, so none is a dependency.

The enqueue logic is written once, as coroutines awaiting a `Db`. An asyncio
connection's `Db` suspends; a sync one blocks instead and never suspends, so
`blocking` runs the same coroutine to its end in one step.
"""

from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
    suppress,
)
from importlib import import_module
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from ..errors import ConfigError, DrainerError
from . import adapters, sql
from .adapters import Row

T = TypeVar("T")

# What enqueue takes: a psycopg 3 Connection or Cursor, a psycopg 2 connection or
# cursor, a SQLAlchemy Connection or Session, Django's connection; the async functions
# take a psycopg 3 AsyncConnection or AsyncCursor, a SQLAlchemy AsyncConnection or
# AsyncSession on psycopg 3. Recognised when used (`for_sync`, `for_async`).
Connectable: TypeAlias = object

SYNC_KINDS = ("a psycopg 3 or psycopg 2 connection or cursor, a SQLAlchemy Connection or "
              "Session, or Django's django.db.connection")
ASYNC_KINDS = ("a psycopg 3 AsyncConnection, or a SQLAlchemy AsyncConnection or AsyncSession "
               "on postgresql+psycopg")


def blocking(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine whose awaits are a sync connection's I/O: they block
    rather than suspend, so one step runs it to its end."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise RuntimeError("an enqueue on a sync connection waited for an event loop")


def run_sync(conn: Connectable, work: Callable[["Db"], Coroutine[Any, Any, T]]) -> T:
    """`work` done on the `Db` of the caller's sync connection (`for_sync`); what it
    lets through (`adapters.passing`) raised as the caller's framework raises its driver's."""
    db = for_sync(conn)
    with db.framework:
        return blocking(work(db))


async def run_async(conn: Connectable, work: Callable[["Db"], Coroutine[Any, Any, T]]) -> T:
    """`run_sync` for asyncio connections (`for_async`)."""
    db = await for_async(conn)
    with db.framework:
        return await work(db)


class Db:
    """One connection as enqueue uses it: named statements (through the gateway, `sql`,
    and the connection's adapter), savepoints in the caller's transaction, and what
    the schema has."""

    def __init__(self, adapter: adapters.Transactional,
                 framework: AbstractContextManager[None] | None = None):
        self.adapter = adapter
        self.raw = adapter.raw  # the DB-API connection
        self.copies = adapter.copies  # whether it has COPY (else bulk inserts go as JSON)
        # Django's or SQLAlchemy's way of raising its driver's errors, for those
        # enqueue lets through (`adapters.passing`).
        self.framework = framework or nullcontext()

    async def row(self, name: str, params: sql.Params = None, *,
                  first: str | None = None) -> Row | None:
        """The named statement's first row; `first` names a statement sent before it,
        in the same round trip where the driver can."""
        return await sql.fetch(self.adapter, name, params, first=first)

    async def send(self, *names: str) -> None:
        """Statements with no parameters and no rows (savepoints), in one round trip
        where the driver can."""
        await sql.send(self.adapter, *names)

    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A transaction of its own, committed at the end of the block: for a
        connection in autocommit outside any transaction (`own_transaction`)."""
        return self.adapter.transaction()

    async def copy(self, name: str, rows: Iterable[Sequence[object]]) -> int:
        """The named COPY ... FROM STDIN of these rows; how many were written (only
        where `copies`)."""
        return await sql.copy_rows(self.adapter, name, rows)

    def own_transaction(self) -> bool:
        """Whether a statement sent now commits on its own (no caller's transaction)."""
        autocommit, status = self.adapter.status()
        return autocommit and status == TransactionStatus.IDLE

    def in_transaction(self) -> bool:
        _, status = self.adapter.status()
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @asynccontextmanager
    async def atomic(self) -> AsyncIterator[None]:
        """All or nothing: a savepoint in the caller's transaction, or a transaction of
        its own in autocommit. Not psycopg's conn.transaction(), which on a connection
        outside autocommit that has not begun yet begins and commits a transaction of
        its own: the jobs would commit apart from the caller's data."""
        if self.own_transaction():
            async with self.transaction():
                yield
            return
        await self.send("savepoint")
        try:
            yield
        except BaseException:
            with suppress(DrainerError):  # the first error is the one to report
                await self.roll_back()
            raise
        await self.send("savepoint_release")

    async def roll_back(self) -> None:
        """Back to `savepoint`, which is then released: the caller's transaction goes on."""
        if self.in_transaction():
            await self.send("savepoint_rollback", "savepoint_release")

    async def features(self, *, fresh: bool = False) -> sql.Features:
        """What the schema has, read from the catalog once per connection (`fresh`:
        again, in case `migrate` ran since)."""
        return await sql.features_of(self.adapter, fresh=fresh)


def _has(obj: object, *names: str) -> bool:
    return all(hasattr(obj, name) for name in names)


def _named(obj: object) -> str:
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def for_sync(conn: Any) -> Db:
    """The `Db` of the caller's connection, or ConfigError naming what drainer takes."""
    if _is_async(conn):
        raise ConfigError(f"{_named(conn)} is asyncio's: await drainer.enqueue_async or "
                          "enqueue_many_async with it")
    with adapters.foreign_errors():  # a framework's own errors, connecting or beginning
        raw, framework = _dbapi(conn)
    if isinstance(raw, psycopg.Connection):
        return Db(adapters.Psycopg(raw), framework)
    if _has(raw, "cursor", "autocommit", "get_transaction_status"):  # psycopg 2
        return Db(adapters.Psycopg2(raw), framework)
    raise ConfigError(f"drainer cannot enqueue through {_named(conn)}: give it "
                      f"{SYNC_KINDS}")


def _is_async(conn: Any) -> bool:
    return isinstance(conn, psycopg.AsyncConnection | psycopg.AsyncCursor) or _has(
        conn, "sync_session") or _has(conn, "sync_connection")


Framed: TypeAlias = tuple[Any, AbstractContextManager[None] | None]


def _dbapi(conn: Any) -> Framed:
    """The DB-API connection under a framework's, in the framework's transaction, and
    the framework's way of raising that connection's errors (None: none)."""
    if isinstance(conn, psycopg.Connection):
        return conn, None
    if _has(conn, "ensure_connection", "validate_no_broken_transaction"):  # Django
        conn.ensure_connection()
        conn.validate_thread_sharing()  # as its cursor() does
        conn.validate_no_broken_transaction()  # a failed statement inside atomic()
        return conn.connection, conn.wrap_database_errors  # as its cursors raise
    if _has(conn, "get_bind", "connection"):  # a SQLAlchemy Session
        conn = conn.connection()  # its Connection, in the Session's transaction
    if _has(conn, "exec_driver_sql", "in_transaction", "begin"):  # a SQLAlchemy Connection
        if not conn.in_transaction():
            conn.begin()  # as its own first statement would: its commit() commits the job
        return conn.connection.driver_connection, _sqlalchemy_errors(conn.dialect)
    if _has(conn, "execute", "fetchone", "connection"):  # a DB-API cursor
        return conn.connection, None
    return conn, None


@contextmanager
def _sqlalchemy_errors(dialect: Any) -> Iterator[None]:
    """The driver's errors raised as SQLAlchemy raises them for its own statements:
    its class of the same name (OperationalError), with the driver's as `orig`."""
    driver_error = dialect.loaded_dbapi.Error
    try:
        yield
    except driver_error as exc:
        wrapped = import_module("sqlalchemy.exc").DBAPIError.instance(
            None, None, exc, driver_error, dialect=dialect)
        raise wrapped from exc


async def for_async(conn: Any) -> Db:
    """`for_sync` for asyncio connections."""
    with adapters.foreign_errors():
        conn, framework = await _async_dbapi(conn)
    if isinstance(conn, psycopg.AsyncConnection):
        return Db(adapters.AsyncPsycopg(conn), framework)
    if isinstance(conn, psycopg.Connection | psycopg.Cursor) or _has(conn, "ensure_connection"):
        raise ConfigError(f"{_named(conn)} is synchronous: call drainer.enqueue or "
                          "enqueue_many with it")
    raise ConfigError(f"drainer cannot enqueue asynchronously through {_named(conn)}: "
                      f"give it {ASYNC_KINDS}")


async def _async_dbapi(conn: Any) -> Framed:
    """`_dbapi` for asyncio connections."""
    if _has(conn, "sync_session"):  # a SQLAlchemy AsyncSession
        conn = await conn.connection()
    if _has(conn, "sync_connection", "get_raw_connection"):  # a SQLAlchemy AsyncConnection
        if not conn.in_transaction():
            await conn.begin()
        raw = (await conn.get_raw_connection()).driver_connection
        return raw, _sqlalchemy_errors(conn.dialect)
    if isinstance(conn, psycopg.AsyncCursor):
        return conn.connection, None
    return conn, None
