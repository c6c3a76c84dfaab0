"""`db url|env|start|stop`: the embedded PostgreSQL under ./.drainer/, for drainer and
for the user's own app. The server itself (start, join, stop) is drainer.embedded."""

import argparse
import os
import shlex

import psycopg

from .. import config
from ..embedded import EMBEDDED_DIR
from .common import log, open_db


def _db_up(args: argparse.Namespace) -> tuple[str, bool]:
    """Start (or join) the embedded server, migrate it and keep it running after this
    process exits; its URL, and whether it was running already."""
    from .. import embedded

    embedded.library()
    was_running = embedded.running()
    url = embedded.use()
    open_db(args, db=config.Database(url, embedded=True)).close()  # open_db migrates it
    embedded.keep()
    return url, was_running


def _exports(url: str) -> str:
    """The lines a POSIX shell's `eval` runs to point DATABASE_URL at `url`. A
    DRAINER_DATABASE_URL in the environment would win over it for drainer commands,
    which would then drain another database than the app's: it is unset."""
    lines = [f"export DATABASE_URL={shlex.quote(url)}"]
    if os.environ.get("DRAINER_DATABASE_URL"):
        log.info("note: DRAINER_DATABASE_URL is set and drainer commands prefer it to "
                 "DATABASE_URL; eval of these lines unsets it")
        lines.append("unset DRAINER_DATABASE_URL")
    return "\n".join(lines)


def _db_kept(args: argparse.Namespace) -> str:
    """`db url` and `db env`: the server's URL, started and kept if it was not running."""
    url, was_running = _db_up(args)
    if not was_running:
        log.info("started the embedded PostgreSQL in ./%s/; it keeps running until "
                 "`drainer db stop`", EMBEDDED_DIR)
    return url


def cmd_db_url(args: argparse.Namespace) -> None:
    print(_db_kept(args), flush=True)


def cmd_db_env(args: argparse.Namespace) -> None:
    print(_exports(_db_kept(args)), flush=True)


def cmd_db_start(args: argparse.Namespace) -> None:
    url, was_running = _db_up(args)
    log.info("the embedded PostgreSQL in ./%s/ %s; `drainer db stop` stops it",
             EMBEDDED_DIR, "was already running" if was_running else "is started")
    print(_exports(url), flush=True)


def cmd_db_stop(_args: argparse.Namespace) -> None:
    from .. import embedded

    embedded.library()
    busy = embedded.in_use()
    if not embedded.stop():
        log.info("the embedded PostgreSQL in ./%s/ is not running; nothing to stop",
                 EMBEDDED_DIR)
        return
    log.info("stopped the embedded PostgreSQL in ./%s/%s", EMBEDDED_DIR,
             "; the drainer commands using it were disconnected" if busy else "")


def _elsewhere(url: str | None) -> bool:
    """Whether `url` names a database other than the embedded server (whose URL
    names its socket directory, the data directory)."""
    from .. import embedded

    if url is None:
        return False
    try:
        host = psycopg.conninfo.conninfo_to_dict(url).get("host")
    except (psycopg.Error, UnicodeError):  # not a URL libpq can read: not the server's
        return True
    return host is None or os.path.realpath(str(host)) != os.path.realpath(embedded.data_dir())


def cmd_db(args: argparse.Namespace) -> None:
    if _elsewhere(config.database_url(None)):  # the user may expect `db` to follow it
        log.info("note: `db` acts on the embedded PostgreSQL in ./%s/, not on the database "
                 "DATABASE_URL (or DRAINER_DATABASE_URL, PG*) names", EMBEDDED_DIR)
    {"url": cmd_db_url, "env": cmd_db_env, "start": cmd_db_start,
     "stop": cmd_db_stop}[args.action](args)
