"""A FastAPI service that enqueues a job in the same transaction as its own data, then
has the job drained once the transaction has committed.

    DATABASE_URL=postgresql://... uvicorn app:app

POST /orders inserts an order and enqueues its confirmation email in one transaction:
both are committed, or neither. After the commit, the drain is started: on AWS, set
DRAINER_FUNCTION to the drainer function's name or ARN and the service kicks it
(`drainer.aws.kick`); elsewhere, a drain of the queue runs in the background here.
"""

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import BackgroundTasks, FastAPI, HTTPException
from pydantic import BaseModel

import drainer

URL = os.environ["DATABASE_URL"]  # drainer commands read it too
SCHEMA = "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, email text NOT NULL)"


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as conn:
        await conn.execute(SCHEMA)
    yield


app = FastAPI(lifespan=lifespan)


class Order(BaseModel):
    id: int
    email: str


@app.post("/orders", status_code=201)
async def create_order(order: Order, background: BackgroundTasks) -> dict[str, Any]:
    # One transaction: it commits when the block ends, and rolls back if it raises.
    async with await psycopg.AsyncConnection.connect(URL) as conn, conn.transaction():
        try:
            await conn.execute("INSERT INTO orders (id, email) VALUES (%s, %s)",
                               (order.id, order.email))
        except psycopg.errors.UniqueViolation:
            raise HTTPException(409, f"order {order.id} exists already") from None
        job = await drainer.enqueue_async(conn, "email", {"order": order.id},
                                          key=f"order-email:{order.id}")
        if "@" not in order.email:  # a late check: the order and its job go together
            raise HTTPException(422, "not an email address")
    background.add_task(kick, "email")  # runs after the response, the commit long done
    return {"order": order.id, "job": job}


def kick(queue: str) -> None:
    """Start a drain of `queue`: the drainer function on AWS, a local drain elsewhere."""
    function = os.environ.get("DRAINER_FUNCTION")
    if function:
        from drainer.aws.kick import Kicker

        Kicker(function).kick(queue)
        return
    subprocess.run([sys.executable, "-m", "drainer", "drain", "--queue", queue,
                    "--tasks", "tasks"], check=False, cwd=os.path.dirname(__file__) or ".")
