"""`drainer ui`: the web dashboard (drainer.ui), served by uvicorn on 127.0.0.1 by
default, behind a token printed at start (or DRAINER_UI_TOKEN). It reads the database
only when a page is loaded, on a connection opened for that request alone."""

import argparse
import os
import socket
import sys
from datetime import timedelta
from functools import partial

import psycopg

from .. import config
from ..db import APPLICATION_NAME, connect
from ..errors import ConfigError
from ..storage import schema
from ..tasks import select
from .doctor import diagnose

TOKEN_ENV = "DRAINER_UI_TOKEN"
STATEMENT_TIMEOUT = timedelta(seconds=10)  # a page's statements are short; never hang one


def _listening(host: str, port: int) -> socket.socket:
    """The bound socket, so that the URL printed names the port really taken (0: any)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _url(sock: socket.socket, token: str) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/?token={token}"


def cmd_ui(args: argparse.Namespace) -> None:
    try:
        import uvicorn

        from ..ui.app import build
        from ..ui.auth import new_token
        from ..ui.web import Settings
    except ImportError as exc:
        raise ConfigError(f"`drainer ui` needs the ui extra ({exc.name} is missing): "
                          "pip install 'drainer[ui]'") from None
    known = list(select(args.tasks, [])[0]) if args.tasks else None
    db = config.resolve_database(args.database_url)
    opened = partial(connect, db.url, prepare=not args.no_prepare,
                     application_name=f"{APPLICATION_NAME} ui",
                     statement_timeout=STATEMENT_TIMEOUT)
    if db.embedded:
        with opened() as conn:
            schema.migrate(conn)
    token = os.environ.get(TOKEN_ENV) or new_token()
    name = psycopg.conninfo.conninfo_to_dict(db.url).get("dbname") or "(default)"
    app = build(Settings(connect=opened, token=token, database=str(name),
                         read_only=args.read_only, known=known,
                         doctor=partial(diagnose, tasks=known),
                         kick_function=args.kick_function))
    sock = _listening(args.host, args.port)
    print(f"drainer: dashboard at {_url(sock, token)} (Ctrl-C stops it)", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"drainer: listening on {args.host}: anyone who can reach it and has the "
              "token can use it; put TLS in front of it", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           access_log=False))
    server.run(sockets=[sock])
