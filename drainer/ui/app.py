"""The dashboard's web app: its routes behind the token check (drainer/ui/web.py).

It reads the database only when a page is asked for: each request opens its own
connection and closes it before answering, so an idle tab costs the database nothing
(no pool, no session kept, no timer)."""

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from . import actions, pages
from .web import Gate, Settings, Ui, static


def build(settings: Settings) -> Starlette:
    """The dashboard's ASGI app."""
    routes = [*pages.ROUTES, *actions.ROUTES,
              Route("/static/{name}", static, methods=["GET"])]
    app = Starlette(routes=routes, middleware=[Middleware(Gate)])
    app.state.ui = Ui(settings)
    return app
