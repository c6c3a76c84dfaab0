"""The application's own connection, whatever its driver, as enqueue needs it.

A job must commit and roll back with the caller's data, so `enqueue` speaks through
the caller's connection, in its transaction: psycopg 3's (sync or asyncio), psycopg
2's, SQLAlchemy's Connection or Session (sync or asyncio: the DB-API connection
underneath, in their transaction), Django's `django.db.connection`. Each becomes a
`Db`, which sends drainer's named statements as `queries/` writes them: both
psycopgs take its `%(name)s` placeholders. None of those libraries is imported: they
are recognised by what they have, so none is a dependency.

The enqueue logic is written once, as coroutines awaiting a `Db`. An asyncio
connection's `Db` suspends; a sync one blocks instead and never suspends, so
`blocking` runs the same coroutine to its end in one step.
"""

import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    closing,
    contextmanager,
    nullcontext,
    suppress,
)
from dataclasses import fields
from importlib import import_module
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from ..errors import CONFLICTS, ConfigError, DrainerError, translate, translated, unencodable
from . import sql

T = TypeVar("T")
Row = tuple[Any, ...]

# What enqueue takes: a psycopg 3 Connection or Cursor, a psycopg 2 connection or
# cursor, a SQLAlchemy Connection or Session, Django's connection; the async functions
# take a psycopg 3 AsyncConnection or AsyncCursor, a SQLAlchemy AsyncConnection or
# AsyncSession on psycopg 3. Recognised when used (`for_sync`, `for_async`).
Connectable: TypeAlias = object

SYNC_KINDS = ("a psycopg 3 or psycopg 2 connection or cursor, a SQLAlchemy Connection or "
              "Session, or Django's django.db.connection")
ASYNC_KINDS = ("a psycopg 3 AsyncConnection, or a SQLAlchemy AsyncConnection or AsyncSession "
               "on postgresql+psycopg")
# PEP 249's exception classes, which psycopg 3 has under the same names.
_DBAPI_ERRORS = ("IntegrityError", "DataError", "OperationalError", "ProgrammingError",
                 "InternalError", "NotSupportedError", "InterfaceError", "DatabaseError",
                 "Error")


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
    lets through (`passing`) raised as the caller's framework raises its driver's."""
    db = for_sync(conn)
    with db.framework:
        return blocking(work(db))


async def run_async(conn: Connectable, work: Callable[["Db"], Coroutine[Any, Any, T]]) -> T:
    """`run_sync` for asyncio connections (`for_async`)."""
    db = await for_async(conn)
    with db.framework:
        return await work(db)


class Db(ABC):
    """One connection as enqueue uses it: named statements, savepoints in the caller's
    transaction, and what the schema has. Subclasses do the I/O of one driver."""

    copies = False  # whether it has psycopg 3's COPY (else bulk inserts go as JSON)

    def __init__(self, raw: Any, framework: AbstractContextManager[None] | None = None):
        self.raw = raw  # the DB-API connection
        # Django's or SQLAlchemy's way of raising its driver's errors, for those
        # enqueue lets through (`passing`).
        self.framework = framework or nullcontext()

    @abstractmethod
    def status(self) -> tuple[bool, int]:
        """Autocommit, and libpq's transaction status (both psycopgs number it alike)."""

    @abstractmethod
    async def row(self, name: str, params: sql.Params = None, *,
                  first: str | None = None) -> Row | None:
        """The named statement's first row; `first` names a statement sent before it,
        in the same round trip where the driver can."""

    @abstractmethod
    async def send(self, *names: str) -> None:
        """Statements with no parameters and no rows (savepoints), in one round trip
        where the driver can."""

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A transaction of its own, committed at the end of the block: for a
        connection in autocommit outside any transaction (`own_transaction`)."""

    async def copy(self, name: str, rows: Iterable[Sequence[object]]) -> int:
        """The named COPY ... FROM STDIN of these rows; how many were written (only
        where `copies`)."""
        raise NotImplementedError

    def own_transaction(self) -> bool:
        """Whether a statement sent now commits on its own (no caller's transaction)."""
        autocommit, status = self.status()
        return autocommit and status == TransactionStatus.IDLE

    def in_transaction(self) -> bool:
        _, status = self.status()
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
        known = None if fresh else _FEATURES.get(self.raw)
        if known is None:
            found = await self.row("features")
            known = sql.Features(*(found or (False,) * len(fields(sql.Features))))
            with suppress(TypeError):  # a connection no weak reference can point to
                _FEATURES[self.raw] = known
        return known


_FEATURES: "weakref.WeakKeyDictionary[object, sql.Features]" = weakref.WeakKeyDictionary()


class _Psycopg(Db):
    """psycopg 3, sync: through `sql`, the gateway the drain uses too."""

    copies = True
    raw: psycopg.Connection[Any]

    def status(self) -> tuple[bool, int]:
        return self.raw.autocommit, self.raw.info.transaction_status

    def _cursor(self) -> psycopg.Cursor[Row]:
        """Rows as tuples, whatever the app's row factory (a dict drops a column
        whose name repeats)."""
        return self.raw.cursor(row_factory=tuple_row)

    async def row(self, name: str, params: sql.Params = None, *,
                  first: str | None = None) -> Row | None:
        cursor = self._cursor()
        with passing():
            if first is None:
                cursor.execute(sql.QUERIES[name], params or {})
            else:
                with self.raw.pipeline():
                    self.raw.execute(sql.QUERIES[first])
                    cursor.execute(sql.QUERIES[name], params or {})
            return cursor.fetchone()

    async def send(self, *names: str) -> None:
        with passing(), self.raw.pipeline() if len(names) > 1 else nullcontext():
            for name in names:
                self.raw.execute(sql.QUERIES[name])

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with passing(), self.raw.transaction():
            yield

    async def copy(self, name: str, rows: Iterable[Sequence[object]]) -> int:
        count = 0
        with passing(), self.raw.cursor().copy(sql.QUERIES[name]) as copying:
            for row in rows:
                count += 1
                copying.write_row(row)
        return count


class _AsyncPsycopg(Db):
    """psycopg 3's AsyncConnection: the same statements, awaited."""

    copies = True
    raw: psycopg.AsyncConnection[Any]

    def status(self) -> tuple[bool, int]:
        return self.raw.autocommit, self.raw.info.transaction_status

    async def row(self, name: str, params: sql.Params = None, *,
                  first: str | None = None) -> Row | None:
        cursor = self.raw.cursor(row_factory=tuple_row)  # as _Psycopg's
        with passing():
            if first is None:
                await cursor.execute(sql.QUERIES[name], params or {})
            else:
                async with self.raw.pipeline():
                    await self.raw.execute(sql.QUERIES[first])
                    await cursor.execute(sql.QUERIES[name], params or {})
            return await cursor.fetchone()

    async def send(self, *names: str) -> None:
        with passing():
            async with self.raw.pipeline() if len(names) > 1 else nullcontext():
                for name in names:
                    await self.raw.execute(sql.QUERIES[name])

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with passing():
            async with self.raw.transaction():
                yield

    async def copy(self, name: str, rows: Iterable[Sequence[object]]) -> int:
        count = 0
        with passing():
            async with self.raw.cursor().copy(sql.QUERIES[name]) as copying:
                for row in rows:
                    count += 1
                    await copying.write_row(row)
        return count


class _Psycopg2(Db):
    """psycopg 2: the same text (its placeholders are psycopg 3's), through plain
    cursors; no pipeline (a savepoint costs a round trip of its own), and no COPY of
    rows one by one (bulk inserts go as one JSON document)."""

    def status(self) -> tuple[bool, int]:
        return bool(self.raw.autocommit), int(self.raw.get_transaction_status())

    def _cursor(self) -> Any:
        """psycopg 2's plain cursor, whose rows are tuples, whatever the app's
        cursor_factory (a RealDictCursor drops a column whose name repeats)."""
        return self.raw.cursor(cursor_factory=import_module("psycopg2.extensions").cursor)

    async def row(self, name: str, params: sql.Params = None, *,
                  first: str | None = None) -> Row | None:
        if first is not None:
            await self.send(first)
        with _foreign_errors(), closing(self._cursor()) as cursor:
            cursor.execute(sql.QUERIES[name], params or {})
            found = cursor.fetchone()
            return None if found is None else tuple(found)

    async def send(self, *names: str) -> None:
        with _foreign_errors(), closing(self._cursor()) as cursor:
            for name in names:
                cursor.execute(sql.QUERIES[name])

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        # DB-API has no BEGIN: autocommit off for the block, then commit or roll back.
        self.raw.autocommit = False
        try:
            try:
                yield
            except BaseException:
                with suppress(Exception):
                    self.raw.rollback()
                raise
            with _foreign_errors():
                self.raw.commit()
        finally:
            self.raw.autocommit = True


def passing() -> AbstractContextManager[None]:
    """psycopg 3's errors translated as drainer's, but a conflict with another
    transaction (`errors.CONFLICTS`) raised as the driver's own error, unchanged: only
    the caller can run its transaction again, and its retry loop knows that error,
    not drainer's."""
    return translated(keep=CONFLICTS)


@contextmanager
def _foreign_errors() -> Iterator[None]:
    """Another driver's errors as drainer's: through psycopg 3's class for the same
    SQLSTATE (or PEP 249 class), which `errors.translate` knows, kept as the cause; a
    conflict raised unchanged, as `passing` does."""
    try:
        yield
    except UnicodeEncodeError as exc:
        raise unencodable(exc) from exc
    except Exception as exc:
        twin = _twin(exc)
        if twin is None or isinstance(twin, CONFLICTS):
            raise
        raise translate(twin) from twin


def _twin(exc: Exception) -> psycopg.Error | None:
    """psycopg 3's error for a psycopg 2 (or other DB-API) error, caused by it."""
    kind: type[psycopg.Error] | None = None
    code = getattr(exc, "pgcode", None)
    if isinstance(code, str):
        with suppress(KeyError):
            kind = psycopg.errors.lookup(code)
    if kind is None:
        names = {k.__name__ for k in type(exc).__mro__}
        kind = next((getattr(psycopg, n) for n in _DBAPI_ERRORS if n in names), None)
    if kind is None:
        return None
    twin = kind(str(exc))
    twin.__cause__ = exc
    return twin


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
    with _foreign_errors():  # a framework's own errors, connecting or beginning
        raw, framework = _dbapi(conn)
    if isinstance(raw, psycopg.Connection):
        return _Psycopg(raw, framework)
    if _has(raw, "cursor", "autocommit", "get_transaction_status"):  # psycopg 2
        return _Psycopg2(raw, framework)
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
    with _foreign_errors():
        conn, framework = await _async_dbapi(conn)
    if isinstance(conn, psycopg.AsyncConnection):
        return _AsyncPsycopg(conn, framework)
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
