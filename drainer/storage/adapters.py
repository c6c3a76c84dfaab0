"""The gateway's drivers: how each driver sends a statement's text with its parameters
and fetches its rows, for the connections `sql` does not drive itself (psycopg 3's
asyncio one, psycopg 2's, Django's cursors, and psycopg 3's sync one in the caller's
transaction). Only this module and `sql` touch a driver's cursors: they know no
statement by name (`sql` hands them the text) and no enqueue logic (`drivers`).

The methods are coroutines: an asyncio connection's suspend; a sync one's block and
never suspend (`drivers.blocking` runs them in one step).
"""

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    closing,
    contextmanager,
    nullcontext,
    suppress,
)
from importlib import import_module
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from ..errors import CONFLICTS, translate, translated, unencodable

Row = tuple[Any, ...]
Params = dict[str, Any]

# PEP 249's exception classes, which psycopg 3 has under the same names.
_DBAPI_ERRORS = ("IntegrityError", "DataError", "OperationalError", "ProgrammingError",
                 "InternalError", "NotSupportedError", "InterfaceError", "DatabaseError",
                 "Error")


class Adapter(ABC):
    """One connection's way to send statement text and fetch rows."""

    def __init__(self, raw: Any):
        self.raw = raw  # the driver's connection

    @abstractmethod
    async def row(self, text: str, params: Params, first: str | None = None) -> Row | None:
        """The statement's first row (None: none, or it returns no rows); `first` is
        a statement with no parameters sent before it, in the same round trip where
        the driver can."""

    @abstractmethod
    async def send(self, *texts: str) -> None:
        """Statements with no parameters and no rows (savepoints), in one round trip
        where the driver can."""

    async def script(self, text: str) -> None:
        """Several statements in one text, with no parameters (a migration)."""
        await self.send(text)


class Transactional(Adapter):
    """An adapter over a DB-API connection that enqueue also asks about its
    transaction, and that may begin one of its own."""

    copies = False  # whether it has psycopg 3's COPY (else bulk inserts go as JSON)

    @abstractmethod
    def status(self) -> tuple[bool, int]:
        """Autocommit, and libpq's transaction status (both psycopgs number it alike)."""

    @abstractmethod
    def transaction(self) -> AbstractAsyncContextManager[None]:
        """A transaction of its own, committed at the end of the block."""

    async def copy(self, text: str, rows: Iterable[Sequence[object]]) -> int:
        """The COPY ... FROM STDIN of these rows; how many were written (only where
        `copies`)."""
        raise NotImplementedError


class Psycopg(Transactional):
    """psycopg 3, sync, in the caller's transaction."""

    copies = True
    raw: psycopg.Connection[Any]

    def status(self) -> tuple[bool, int]:
        return self.raw.autocommit, self.raw.info.transaction_status

    async def row(self, text: str, params: Params, first: str | None = None) -> Row | None:
        # Rows as tuples, whatever the app's row factory (a dict drops a column whose
        # name repeats).
        cursor = self.raw.cursor(row_factory=tuple_row)
        with passing():
            if first is None:
                cursor.execute(text, params)
            else:
                with self.raw.pipeline():
                    self.raw.execute(first)
                    cursor.execute(text, params)
            return cursor.fetchone() if cursor.description else None

    async def send(self, *texts: str) -> None:
        with passing(), self.raw.pipeline() if len(texts) > 1 else nullcontext():
            for text in texts:
                self.raw.execute(text)

    async def script(self, text: str) -> None:
        with passing():
            self.raw.execute(text, prepare=False)  # several statements: never prepared

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with passing(), self.raw.transaction():
            yield

    async def copy(self, text: str, rows: Iterable[Sequence[object]]) -> int:
        count = 0
        with passing(), self.raw.cursor().copy(text) as copying:
            for row in rows:
                count += 1
                copying.write_row(row)
        return count


class AsyncPsycopg(Transactional):
    """psycopg 3's AsyncConnection: the same statements, awaited."""

    copies = True
    raw: psycopg.AsyncConnection[Any]

    def status(self) -> tuple[bool, int]:
        return self.raw.autocommit, self.raw.info.transaction_status

    async def row(self, text: str, params: Params, first: str | None = None) -> Row | None:
        cursor = self.raw.cursor(row_factory=tuple_row)  # as Psycopg's
        with passing():
            if first is None:
                await cursor.execute(text, params)
            else:
                async with self.raw.pipeline():
                    await self.raw.execute(first)
                    await cursor.execute(text, params)
            return await cursor.fetchone() if cursor.description else None

    async def send(self, *texts: str) -> None:
        with passing():
            async with self.raw.pipeline() if len(texts) > 1 else nullcontext():
                for text in texts:
                    await self.raw.execute(text)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        with passing():
            async with self.raw.transaction():
                yield

    async def copy(self, text: str, rows: Iterable[Sequence[object]]) -> int:
        count = 0
        with passing():
            async with self.raw.cursor().copy(text) as copying:
                for row in rows:
                    count += 1
                    await copying.write_row(row)
        return count


class Psycopg2(Transactional):
    """psycopg 2: the same text (its placeholders are psycopg 3's), through plain
    cursors; no pipeline (a savepoint costs a round trip of its own), and no COPY of
    rows one by one (bulk inserts go as one JSON document)."""

    def status(self) -> tuple[bool, int]:
        return bool(self.raw.autocommit), int(self.raw.get_transaction_status())

    def _cursor(self) -> Any:
        """psycopg 2's plain cursor, whose rows are tuples, whatever the app's
        cursor_factory (a RealDictCursor drops a column whose name repeats)."""
        return self.raw.cursor(cursor_factory=import_module("psycopg2.extensions").cursor)

    async def row(self, text: str, params: Params, first: str | None = None) -> Row | None:
        if first is not None:
            await self.send(first)
        with foreign_errors(), closing(self._cursor()) as cursor:
            cursor.execute(text, params)
            found = cursor.fetchone() if cursor.description else None
            return None if found is None else tuple(found)

    async def send(self, *texts: str) -> None:
        with foreign_errors(), closing(self._cursor()) as cursor:
            for text in texts:
                cursor.execute(text)

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
            with foreign_errors():
                self.raw.commit()
        finally:
            self.raw.autocommit = True


class DjangoCursors(Adapter):
    """Django's connection through its own cursors (its query log, its execute
    wrappers, its client-side binding where configured), raising Django's errors."""

    async def row(self, text: str, params: Params, first: str | None = None) -> Row | None:
        if first is not None:
            await self.send(first)
        with self.raw.cursor() as cursor:
            cursor.execute(text, params)
            found = cursor.fetchone() if cursor.description else None
            return None if found is None else tuple(found)

    async def send(self, *texts: str) -> None:
        with self.raw.cursor() as cursor:
            for text in texts:
                cursor.execute(text)

    async def script(self, text: str) -> None:
        with self.raw.cursor() as cursor:
            if isinstance(cursor.cursor, psycopg.Cursor):  # never prepared, whatever
                with self.raw.wrap_database_errors:  # OPTIONS' prepare_threshold says
                    cursor.cursor.execute(text, prepare=False)
            else:
                cursor.execute(text)


def passing() -> AbstractContextManager[None]:
    """psycopg 3's errors translated as drainer's, but a conflict with another
    transaction (`errors.CONFLICTS`) raised as the driver's own error, unchanged: only
    the caller can run its transaction again, and its retry loop knows that error,
    not drainer's."""
    return translated(keep=CONFLICTS)


@contextmanager
def foreign_errors() -> Iterator[None]:
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
