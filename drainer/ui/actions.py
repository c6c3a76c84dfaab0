"""The dashboard's actions (POST, with the CSRF field): requeue a failed job, requeue
a group of them (exactly the ids its confirmation counted), cancel a queued or running
job, pause or resume a queue. They are `drainer requeue`, `cancel`, `pause` and
`resume` (drainer.storage.admin and pauses; a resume kicks the function --kick
names, as the command does); in
read-only mode they are refused, and the pages show no button for them."""

from urllib.parse import parse_qs

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..model import Requeued
from ..storage import admin, pauses
from .pages import read
from .web import ui_of

MAX_IDS = 100_000  # ids a group's form may carry (the confirmation lists at most CAP)


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form (its last value per name), parsed without a multipart library."""
    body = (await request.body()).decode("utf-8", "replace")
    return {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}


async def _checked(request: Request) -> tuple[dict[str, str], Response | None]:
    """The form, or the refusal: read-only mode, or no valid CSRF field."""
    ui = ui_of(request)
    form = await _form(request)
    if ui.settings.read_only:
        return form, ui.render(request, "refused.html", status=403,
                               why="The dashboard runs read-only (--read-only).")
    if not ui.guard.form_ok(request, form):
        return form, ui.render(request, "refused.html", status=403,
                               why="The form's CSRF token is missing or wrong: reload the "
                                   "page and try again.")
    return form, None


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",")[:MAX_IDS] if part.strip().isdigit()]


async def requeue(request: Request) -> Response:
    """Requeue one job (by path) or the ids a group's confirmation counted."""
    form, refused = await _checked(request)
    if refused:
        return refused
    job_id = request.path_params.get("id")
    ids = [job_id] if job_id is not None else _ids(form.get("ids", ""))

    def run(conn: psycopg.Connection) -> Requeued:
        return admin.requeue(conn, ids=ids)

    done = await read(ui_of(request), run)
    return ui_of(request).render(request, "done.html", action="requeued", asked=ids,
                                 done=list(done), held=done.held, waiting=done.waiting)


async def cancel(request: Request) -> Response:
    form, refused = await _checked(request)
    if refused:
        return refused
    ids = [request.path_params["id"]]

    def run(conn: psycopg.Connection) -> list[int]:
        return admin.cancel(conn, ids)

    done = await read(ui_of(request), run)
    return ui_of(request).render(request, "done.html", action="cancelled", asked=ids,
                                 done=done, held={}, waiting={})


async def pause_or_resume(request: Request) -> Response:
    """Pause a queue (no drainer claims its jobs from its next claim on) or resume it
    (and wake a `work` draining it, and kick the function --kick names):
    `drainer pause` and `drainer resume`."""
    form, refused = await _checked(request)
    if refused:
        return refused
    queue, pausing = form.get("queue", ""), request.url.path.endswith("/pause")

    def run(conn: psycopg.Connection) -> bool:
        return (pauses.pause if pausing else pauses.resume)(conn, queue)

    changed = await read(ui_of(request), run)  # committed: its connection autocommits
    function = ui_of(request).settings.kick_function
    if changed and function and not pausing:
        await run_in_threadpool(_kick, function, queue)
    return RedirectResponse("/", status_code=303)


def _kick(function: str, queue: str) -> None:
    """Invoke the function for the resumed queue; coalesced, retried, never raises."""
    from ..aws.kick import Kicker  # only with a kick: a dashboard without needs no AWS

    Kicker(function).kick(queue)


ROUTES = [
    Route("/queues/pause", pause_or_resume, methods=["POST"]),
    Route("/queues/resume", pause_or_resume, methods=["POST"]),
    Route("/jobs/{id:int}/requeue", requeue, methods=["POST"]),
    Route("/jobs/{id:int}/cancel", cancel, methods=["POST"]),
    Route("/failed/requeue", requeue, methods=["POST"]),
]
