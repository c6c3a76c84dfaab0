"""What the dashboard's pages share: its settings, the token check in front of every
page, the security headers, the rendering of its Jinja2 templates (which escape every
value), and a connection of each request's own."""

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any

import psycopg
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .. import __version__, clock
from ..errors import DrainerError, redact
from .auth import COOKIE, Guard, without_token

Doctor = Callable[[psycopg.Connection], Sequence[Any]]  # the findings of `doctor`


@dataclass(frozen=True)
class Settings:
    """What `drainer ui` hands the app: how to connect (a new connection per request),
    the token, whether actions are hidden, the queues that have a task (with --tasks),
    the `doctor` checks, the database's name (the only part of its URL shown), and
    the Lambda function a resume kicks (--kick)."""

    connect: Callable[[], psycopg.Connection]
    token: str
    database: str
    read_only: bool = False
    known: Sequence[str] | None = None
    doctor: Doctor | None = None
    kick_function: str | None = None


STATIC = {"style.css": "text/css", "live.js": "text/javascript",
          "favicon.svg": "image/svg+xml"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; script-src 'self'; "
                               "img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # never to another site; Origin stays on POSTs
    "Cache-Control": "no-store",
}


def _templates() -> Environment:
    env = Environment(loader=PackageLoader("drainer.ui", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["age"] = age
    env.filters["moment"] = moment
    return env


def age(seconds: float | None) -> str:
    """A duration for a person: 42 s, 3 min, 5 h, 2 d."""
    if seconds is None:
        return "–"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if abs(seconds) >= size * 2:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


_FRACTION = re.compile(r"\.\d+")
_UTC = re.compile(r"\+00(:00)?$")


def moment(value: object) -> str:
    """A time to the second, with its offset (UTC said so), as the database wrote it."""
    if value is None:
        return "–"
    text = value.isoformat(sep=" ") if isinstance(value, datetime) else str(value)
    return _UTC.sub(" UTC", _FRACTION.sub("", text.replace("T", " ")))


class Ui:
    """The app's shared state: its settings, guard and templates."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.guard = Guard(settings.token)
        self.env = _templates()

    def render(self, request: Request, template: str, status: int = 200,
               **values: Any) -> HTMLResponse:
        read_at = datetime.fromtimestamp(clock.wall(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        page = self.env.get_template(template).render(
            request=request, settings=self.settings, csrf=self.guard.csrf,
            version=__version__, read_at=read_at, **values)
        return HTMLResponse(page, status_code=status)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A connection of this request's own, closed when it ends."""
        with self.settings.connect() as conn:
            yield conn


def ui_of(request: Request) -> Ui:
    found: Ui = request.app.state.ui
    return found


Call = Callable[[Request], Awaitable[Response]]


class Gate(BaseHTTPMiddleware):
    """The token check in front of every page but the stylesheet and script, the
    database's errors as a page, and the headers of every answer."""

    async def dispatch(self, request: Request, call_next: Call) -> Response:
        ui = ui_of(request)
        if request.url.path.startswith("/static/"):
            response = await call_next(request)
        elif ui.guard.exchanges(request):
            response = RedirectResponse(without_token(request), status_code=303)
            response.set_cookie(COOKIE, ui.guard.cookie, httponly=True, samesite="strict",
                                path="/")
        elif not ui.guard.allows(request):
            response = ui.render(request, "denied.html", status=401)
        else:
            try:
                response = await call_next(request)
            except DrainerError as exc:
                response = ui.render(request, "error.html", status=503,
                                     message=redact(str(exc)))
        response.headers.update(HEADERS)
        return response


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    text = files("drainer.ui").joinpath("static").joinpath(name).read_text(encoding="utf-8")
    return Response(text, media_type=STATIC[name])
