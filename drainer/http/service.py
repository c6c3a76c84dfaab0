"""The ASGI application: POST / with a signature or a bearer token runs one drain
and answers its summary as JSON (drainer.http.run); so does GET, which is what
Vercel cron sends. Anything else is refused with a status and a JSON `error`, and
claims nothing."""

import logging

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import clock
from .. import settings as s
from ..errors import DrainerError, redact
from . import auth
from .run import Settings, drain_once, keys_from_env

log = logging.getLogger(__name__)

MAX_RUNTIME = "drainer-max-runtime"  # seconds the caller gives the drain, capped
# Exit codes as statuses: the service's configuration (2) or a bug (1) is the
# server's error; the database's state (3) may pass, so the caller may try later.
STATUS = {1: 500, 2: 500, 3: 503}


async def drain_request(request: Request) -> JSONResponse:
    body = await request.body()
    try:
        keys = keys_from_env()
        signature = auth.check(keys, request.headers, body, clock.wall())
        settings = Settings.from_env()
        runtime = _runtime(request.headers.get(MAX_RUNTIME), settings.max_runtime)
        result = await run_in_threadpool(drain_once, settings, signature, keys.window,
                                         runtime)
    except auth.Refused as exc:
        return _error(exc.status, str(exc))
    except DrainerError as exc:
        return _error(STATUS.get(exc.exit_code, 500), redact(str(exc)), exc.summary)
    return JSONResponse(result)


def _runtime(asked: str | None, cap: float) -> float:
    """The seconds the caller asked for, at most `cap`; 400 for a value that is not."""
    if asked is None:
        return cap
    try:
        return min(s.max_runtime_seconds(asked), cap)
    except ValueError as exc:
        raise auth.Refused(400, f"{MAX_RUNTIME}: {exc}") from None


def _error(status: int, message: str, summary: dict[str, object] | None = None
           ) -> JSONResponse:
    log.warning("refused a drain request (%d): %s", status, message)
    return JSONResponse({**(summary or {}), "error": message}, status_code=status)


def create_app() -> Starlette:
    """The application; its settings are read at each request, from the environment."""
    return Starlette(routes=[Route("/", drain_request, methods=["POST", "GET"])])
