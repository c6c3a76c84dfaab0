"""PgQueuer's side of the bench, run inside PgQueuer's own virtualenv.

`pgq run pgqueuer_app:noop --mode drain` (or `:sleep`) drains the bench's jobs;
`python pgqueuer_app.py seed KIND N` enqueues them. The database URL comes from
BENCH_DB_URL.
"""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries


async def _connect() -> asyncpg.Connection:
    return await asyncpg.connect(os.environ["BENCH_DB_URL"])


@asynccontextmanager
async def _queuer(entrypoint: str, handler) -> AsyncIterator[PgQueuer]:
    """What `pgq run` wants from a factory: an async context manager."""
    conn = await _connect()
    try:
        pgq = PgQueuer(AsyncpgDriver(conn))
        pgq.entrypoint(entrypoint)(handler)
        yield pgq
    finally:
        await conn.close()


async def _noop(job: Job) -> None:
    pass


async def _sleep(job: Job) -> None:
    await asyncio.sleep(0.01)


def noop() -> AbstractAsyncContextManager[PgQueuer]:
    return _queuer("noop", _noop)


def sleep() -> AbstractAsyncContextManager[PgQueuer]:
    return _queuer("sleep", _sleep)


async def seed(kind: str, n: int) -> None:
    conn = await _connect()
    try:
        await Queries(AsyncpgDriver(conn)).enqueue([kind] * n, [None] * n, [0] * n)
    finally:
        await conn.close()


if __name__ == "__main__":
    _, command, kind, n = sys.argv
    assert command == "seed", command
    asyncio.run(seed(kind, int(n)))
