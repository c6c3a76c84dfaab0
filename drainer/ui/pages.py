"""The dashboard's pages (GET): queues, schedules, jobs, one job, failures grouped by
error (and a group's requeue confirmation), and `doctor`'s findings. Each opens a
connection, sends a few short statements (drainer/ui/reads.py) and closes it."""

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import DrainerError, redact
from . import reads
from .web import Ui, ui_of

T = TypeVar("T")


async def read(ui: Ui, fn: Callable[[psycopg.Connection], T]) -> T:
    """`fn` on a connection of its own, in a worker thread (psycopg's sync calls)."""
    def run() -> T:
        with ui.connection() as conn:
            return fn(conn)

    return await run_in_threadpool(run)


async def page(request: Request, template: str,
               fn: Callable[[psycopg.Connection], dict[str, Any]]) -> Response:
    """A page whose values `fn` reads; a schema `migrate` has not brought up to date
    says so instead."""
    ui = ui_of(request)

    def values(conn: psycopg.Connection) -> dict[str, Any]:
        lacking = reads.missing(conn)
        return {"missing": lacking} if lacking else fn(conn)

    found = await read(ui, values)
    if "missing" in found:
        return ui.render(request, "migrate.html", status=503, **found)
    return ui.render(request, template, status=found.pop("status", 200), **found)


async def queues(request: Request) -> Response:
    known = ui_of(request).settings.known
    return await page(request, "queues.html",
                      lambda conn: {"data": reads.queues(conn, known), "cap": reads.CAP})


async def schedules(request: Request) -> Response:
    return await page(request, "schedules.html",
                      lambda conn: {"schedules": reads.schedule_list(conn)})


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


def _number(request: Request, name: str) -> int | None:
    value = request.query_params.get(name, "")
    return int(value) if value.isdigit() and len(value) < 19 else None


async def jobs(request: Request) -> Response:
    state = _text(request, "state")
    filters = reads.Filters(queue=_text(request, "queue"),
                            state=state if state in reads.FILTERS else None,
                            key=_text(request, "key"), error=_text(request, "error"),
                            before=_number(request, "before"))
    return await page(request, "jobs.html", lambda conn: {
        "page": reads.jobs(conn, filters), "filters": filters, "states": reads.FILTERS,
        "cap": reads.CAP})


async def job(request: Request) -> Response:
    job_id = request.path_params["id"]

    def values(conn: psycopg.Connection) -> dict[str, Any]:
        shown = reads.job(conn, job_id)
        return {"job": shown, "id": job_id, "status": 200 if shown else 404}

    return await page(request, "job.html", values)


async def failed(request: Request) -> Response:
    def values(conn: psycopg.Connection) -> dict[str, Any]:
        groups, capped = reads.failed_groups(conn)
        return {"groups": groups, "capped": capped, "cap": reads.CAP}

    return await page(request, "failed.html", values)


async def failed_group(request: Request) -> Response:
    """The confirmation of a group's requeue: how many jobs, and their ids, which the
    form sends back so that the requeue applies to exactly these."""
    queue = request.query_params.get("queue", "")
    error = None if "null" in request.query_params else request.query_params.get("error", "")
    return await page(request, "group.html", lambda conn: {
        "queue": queue, "error": error, "ids": reads.failed_group(conn, queue, error),
        "cap": reads.CAP})


async def doctor(request: Request) -> Response:
    """`doctor`'s findings; a role that may only read gets what stopped them (the checks
    EXPLAIN the claim, an UPDATE, which needs that privilege)."""
    check = ui_of(request).settings.doctor

    def values(conn: psycopg.Connection) -> dict[str, Any]:
        try:
            return {"findings": [] if check is None else list(check(conn))}
        except DrainerError as exc:
            return {"findings": [], "stopped": redact(str(exc))}

    return await page(request, "doctor.html", values)


ROUTES = [
    Route("/", queues, methods=["GET"]),
    Route("/schedules", schedules, methods=["GET"]),
    Route("/jobs", jobs, methods=["GET"]),
    Route("/jobs/{id:int}", job, methods=["GET"]),
    Route("/failed", failed, methods=["GET"]),
    Route("/failed/group", failed_group, methods=["GET"]),
    Route("/doctor", doctor, methods=["GET"]),
]
