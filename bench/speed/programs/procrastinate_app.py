"""procrastinate's side of the bench, run inside procrastinate's own virtualenv.

`procrastinate --app procrastinate_app.app worker --queues bench --one-shot` drains
the bench's jobs; `python procrastinate_app.py seed KIND N` defers them. The
database URL comes from BENCH_DB_URL.
"""

import asyncio
import os
import sys

import procrastinate

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DB_URL", ""))
)


@app.task(name="noop", queue="bench")
async def noop() -> None:
    pass


@app.task(name="sleep", queue="bench")
async def sleep() -> None:
    await asyncio.sleep(0.01)


def seed(kind: str, n: int) -> None:
    task = {"noop": noop, "sleep": sleep}[kind]
    with app.open():
        for start in range(0, n, 1000):  # one INSERT per thousand jobs
            task.batch_defer(*({} for _ in range(min(1000, n - start))))


if __name__ == "__main__":
    _, command, kind, n = sys.argv
    assert command == "seed", command
    seed(kind, int(n))
