"""The SQL gateway: every statement drainer sends goes through here, by name.

All SQL lives in `queries/`: the named statements, a file per role (`claim.sql`,
`writeback.sql`, ...), and the migrations (`schema.sql`), so one folder shows every
statement we send; this module sends them, returns their rows and turns psycopg's
errors into drainer's (`errors.translate`). It drives psycopg 3's sync connections
itself (the drain's); every other connection (the caller's, whatever its driver)
through its `adapters` one, which only sends the text this module gives it.
It also knows, once per connection, which optional objects the schema has.
"""

import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from functools import cache
from importlib.resources import files
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.types.json import JsonbLoader

from ..errors import translated
from .adapters import Adapter, Row, Transactional

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^-- migration: (\d+)\b.*$", re.MULTILINE)
_INCLUDE = re.compile(r"\(:(\w+)\)")

Target = psycopg.Connection | psycopg.Cursor
Params = dict[str, Any] | None


_QUERIES = files("drainer").joinpath("storage").joinpath("queries")
# Not named statements: the migrations, the roles a DBA creates, the claims written out.
_NOT_STATEMENTS = ("schema.sql", "roles.sql")
_GENERATED = ".generated.sql"


def _read(name: str) -> str:
    return _QUERIES.joinpath(name).read_text(encoding="utf-8")


def _strip_comments(body: str) -> str:
    # Comments are for readers of the file; psycopg would also see placeholders in them.
    lines = (line for line in body.splitlines() if not line.lstrip().startswith("--"))
    return "\n".join(lines).strip()


def _sections(text: str, marker: re.Pattern[str]) -> list[tuple[str, str]]:
    parts = marker.split(text)
    # parts = [preamble, key1, body1, key2, body2, ...]
    return [(k, _strip_comments(body)) for k, body in zip(parts[1::2], parts[2::2], strict=True)]


def _split(text: str, marker: re.Pattern[str]) -> dict[str, str]:
    return dict(_sections(text, marker))


def _statement_files() -> list[str]:
    return sorted(f.name for f in _QUERIES.iterdir() if f.name.endswith(".sql")
                  and f.name not in _NOT_STATEMENTS and not f.name.endswith(_GENERATED))


def _load(texts: Mapping[str, str]) -> dict[str, str]:
    """The named statements of every file (name: its text); ValueError when two
    statements share a name, which one would silently replace."""
    parts: dict[str, str] = {}
    where: dict[str, str] = {}
    for file, text in texts.items():
        for name, body in _sections(text, _NAME):
            if name in parts:
                raise ValueError(f"statement {name!r} is named twice: in {where[name]} and "
                                 f"in {file}")
            parts[name], where[name] = body, file
    return parts


_PARTS: dict[str, str] = _load({name: _read(name) for name in _statement_files()})


def _expand(name: str, swaps: Mapping[str, str]) -> str:
    """The named statement with each `(:part)` replaced by that statement as a subquery
    (recursively), or by the one `swaps` names instead of it, in which `(:part)` is
    the part it replaces (so it may wrap it). A swap may name a chain, "a>b": a, in
    which `(:part)` is b, in which it is the part itself (b wraps it inside a)."""
    def include(m: re.Match[str]) -> str:
        if m[1] not in swaps:
            return f"({_expand(m[1], swaps).rstrip(';')})"
        outer, _, rest = swaps[m[1]].partition(">")
        inner = {k: v for k, v in swaps.items() if k != m[1]}
        if rest:
            inner[m[1]] = rest
        return f"({_expand(outer, inner).rstrip(';')})"

    return _INCLUDE.sub(include, _PARTS[name])


QUERIES: dict[str, str] = {name: _expand(name, {}) for name in _PARTS}


@cache
def variant(name: str, **swaps: str) -> str:
    """The named statement with some of its included parts swapped for others: how one
    statement serves two schemas (a table made by hand, a migrated one) without a
    second copy of the parts they share."""
    return _expand(name, swaps)
MIGRATIONS: dict[int, str] = {
    int(k): v for k, v in _split(_read("schema.sql"), _MIGRATION).items()
}
LATEST_VERSION = max(MIGRATIONS)


def execute(target: Target, text: str, params: Params = None) -> psycopg.Cursor:
    """Send one statement's text (a named one, or one built from names); errors
    translated. For the few statements whose text depends on a value (the claim's
    LIMIT, `doctor`'s EXPLAIN); everything else goes through `run`."""
    with translated():
        return target.execute(text, params or {})


def run(target: Target, name: str, params: Params = None) -> psycopg.Cursor:
    """Send the named statement; its cursor holds the rows."""
    return execute(target, QUERIES[name], params)


def rows(target: Target, name: str, params: Params = None) -> list[tuple[Any, ...]]:
    """Every row of the named statement."""
    cursor = run(target, name, params)
    with translated():
        return cursor.fetchall()


def row(target: Target, name: str, params: Params = None) -> tuple[Any, ...] | None:
    """The named statement's first row, None when it returns none."""
    cursor = run(target, name, params)
    with translated():
        return cursor.fetchone()


def value(target: Target, name: str, params: Params = None) -> Any:
    """The first column of the named statement's one row."""
    found = row(target, name, params)
    if found is None:
        raise LookupError(f"statement {name!r} returned no row")
    return found[0]


def command(conn: psycopg.Connection, text: str) -> None:
    """Send a statement built around identifiers (a database's name) as it is, its
    errors psycopg's: `drainer.testing`'s databases."""
    conn.execute(text)


def cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor of its own, for a statement whose rows load otherwise (the claim's
    payloads): `execute` or `run` on it."""
    return conn.cursor()


@contextmanager
def pipeline(conn: psycopg.Connection) -> Iterator[None]:
    """Statements sent within go out together and are answered in one round trip;
    their errors arrive at the end of the block, translated too."""
    with translated(), conn.pipeline():
        yield


@contextmanager
def transaction(conn: psycopg.Connection) -> Iterator[None]:
    with translated(), conn.transaction():
        yield


@contextmanager
def savepoint(conn: psycopg.Connection, failed: Callable[[], bool] = bool) -> Iterator[None]:
    """A savepoint of the connection's open transaction around a handler's call
    (drain_now(in_transaction=True)): what the handler wrote stays, unless one of its
    statements failed and aborted the transaction (or `failed()` says a framework
    marked its block failed), which is then rolled back to the savepoint and goes on.
    A handler that committed or rolled back ended the savepoint with the transaction.
    The handler's exception goes on untranslated."""
    run(conn, "handler_savepoint")
    try:
        yield
    finally:
        status = conn.info.transaction_status
        marked = status != TransactionStatus.IDLE and failed()  # (clears the mark)
        if status == TransactionStatus.INERROR or marked:
            run(conn, "handler_savepoint_rollback")
        if status != TransactionStatus.IDLE:
            run(conn, "handler_savepoint_release")


def json_rows(conn: psycopg.Connection, name: str, params: Params = None
              ) -> list[tuple[Any, ...]]:
    """Every row of the named statement, jsonb loaded as Python values whatever the
    connection's own loaders (Django's load jsonb as text) and rows as tuples
    whatever its row factory (dict_row)."""
    cur = conn.cursor(row_factory=tuple_row)
    cur.adapters.register_loader("jsonb", JsonbLoader)
    with translated():
        return cur.execute(QUERIES[name], params or {}).fetchall()


@contextmanager
def copy(conn: psycopg.Connection, name: str) -> Iterator[psycopg.Copy]:
    """The named COPY ... FROM STDIN, for rows written one by one."""
    with translated(), conn.cursor().copy(QUERIES[name]) as copying:
        yield copying


async def fetch(adapter: Adapter, name: str, params: Params = None, *,
                first: str | None = None) -> Row | None:
    """The named statement's first row through another connection's adapter; `first`
    names a statement sent before it, in the same round trip where the driver can."""
    return await adapter.row(QUERIES[name], params or {},
                             None if first is None else QUERIES[first])


async def migration(adapter: Adapter, version: int) -> None:
    """Apply one migration of `queries/schema.sql` through an adapter."""
    await adapter.script(MIGRATIONS[version])


async def send(adapter: Adapter, *names: str) -> None:
    """Named statements with no parameters and no rows, through an adapter."""
    await adapter.send(*(QUERIES[name] for name in names))


async def copy_rows(adapter: Transactional, name: str, rows: Iterable[Sequence[object]]
                    ) -> int:
    """The named COPY ... FROM STDIN of these rows through an adapter that `copies`."""
    return await adapter.copy(QUERIES[name], rows)


@dataclass(frozen=True)
class Features:
    """The optional parts of the schema (only `jobs` is required): whether `migrate`
    created the version table, the archive table, the done_at column, the priority
    column (and the ready index that orders by it), unique keys (the key column and
    its unique index, which ON CONFLICT needs), the result and meta columns, the
    schedules table, flow control's table of starts, the index of jobs cancelled
    while running and their column, the table of paused queues; and whether the `jobs`
    table is there at all."""

    versioned: bool
    archive: bool
    done_at: bool
    priority: bool
    key: bool
    result: bool
    meta: bool
    schedules: bool
    limits: bool
    cancelled_running_index: bool  # migration 10: jobs_held_idx (limit_cancelled_running)
    cancelled_running: bool  # migration 11: the cancelled_running_until column
    pauses: bool  # migration 13: the table of paused queues
    scheduled: bool  # the schedules table ever held a row (statistics: may lag)
    jobs: bool  # the jobs table itself: a database never migrated has none


# One cache for every driver, keyed by the connection (psycopg 3's, or the DB-API
# connection under an adapter).
_features: "weakref.WeakKeyDictionary[object, Features]" = weakref.WeakKeyDictionary()


def features(conn: psycopg.Connection) -> Features:
    """What the schema has, read from the catalog once per connection (a migration
    run on it since forgets it: `forget`)."""
    known = _features.get(conn)
    if known is None:
        known = learn(conn, row(conn, "features"))
    return known


async def features_of(adapter: Adapter, *, fresh: bool = False) -> Features:
    """`features` through an adapter (`fresh`: read again, in case `migrate` ran since,
    on another connection)."""
    known = None if fresh else _known(adapter.raw)
    if known is None:
        known = learn(adapter.raw, await fetch(adapter, "features"))
    return known


def _known(conn: object) -> Features | None:
    with suppress(TypeError):  # a connection no weak reference can point to
        return _features.get(conn)
    return None


def learn(conn: object, columns: Sequence[bool] | None) -> Features:
    """Record the `features` columns a statement returned (None: no row, nothing
    optional; `start` returns them too)."""
    known = Features(*(columns or (False,) * len(fields(Features))))
    with suppress(TypeError):  # a connection no weak reference can point to
        _features[conn] = known
    return known


def forget(conn: object) -> None:
    """After a migration on `conn`: the next `features` reads the catalog again."""
    with suppress(TypeError):
        _features.pop(conn, None)
