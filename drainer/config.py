"""Which database to use, first found: the flag, Django's database when Django is
configured with drainer installed, `DRAINER_DATABASE_URL`, `DATABASE_URL`, libpq's
`PG*` variables, and outside a cloud function the embedded server. (Every other setting is in
`drainer.settings`.)
"""

import os
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import psycopg

from .errors import ConfigError, describe

CLOUD_MARKERS = ("AWS_LAMBDA_FUNCTION_NAME", "K_SERVICE", "CLOUD_RUN_JOB", "FUNCTION_TARGET")
LIBPQ_MARKERS = ("PGHOST", "PGSERVICE", "PGDATABASE")


def in_cloud_function() -> bool:
    return any(os.environ.get(name) for name in CLOUD_MARKERS)


@dataclass(frozen=True)
class Database:
    """A resolved database: its URL, and whether it is the local embedded server."""

    url: str
    embedded: bool = False


def database_url(flag: str | None) -> str | None:
    """The configured URL, or None when nothing names a database."""
    if flag:
        return flag
    if django_installed():
        return django_url()
    for value in (os.environ.get("DRAINER_DATABASE_URL"), os.environ.get("DATABASE_URL")):
        if value:
            return value
    if any(os.environ.get(name) for name in LIBPQ_MARKERS):
        return ""  # libpq fills everything from PG* variables
    return None


def function_url(secret: str | None, secret_variable: str) -> str | None:
    """A cloud function's database URL when its secret (set by `secret_variable`)
    is not given, None when it is; ConfigError when neither names a database."""
    if secret:
        return None
    url = database_url(None)
    if url is None:
        raise ConfigError("no database configured: set DATABASE_URL (or DRAINER_DATABASE_URL) "
                          f"or {secret_variable} in the function's environment")
    return url


def resolve_database(flag: str | None, *, force_embedded: bool = False) -> Database:
    """The database to use; starts (and migrates) the embedded one when none is named."""
    url = None if force_embedded else database_url(flag)
    if url is not None:
        return Database(url)
    if in_cloud_function():
        raise ConfigError(
            "no database URL: set DATABASE_URL (or DRAINER_DATABASE_URL, or a secret) "
            "in the function's configuration"
        )
    return Database(_start_embedded(), embedded=True)


def _start_embedded() -> str:
    """The embedded server's URL; it runs until this process and the others using it
    have exited, then stops unless `drainer db start` kept it (drainer.embedded)."""
    from . import embedded

    embedded.library()  # no note on stderr when the extra is missing
    print("drainer: no database URL given; using the embedded PostgreSQL in "
          f"./{embedded.EMBEDDED_DIR}/", file=sys.stderr)
    return embedded.use()


# Django's database: one of its DATABASES, named by the DRAINER setting.

DJANGO_SETTINGS = {"DATABASE"}  # the keys of the DRAINER setting
APP = "drainer.contrib.django"  # in INSTALLED_APPS (or its AppConfig's path)


def django_configured() -> bool:
    """Whether this process runs with a Django project's settings: named by
    DJANGO_SETTINGS_MODULE (manage.py sets it), or configured in code."""
    if os.environ.get("DJANGO_SETTINGS_MODULE"):
        return find_spec("django") is not None
    conf = sys.modules.get("django.conf")
    return conf is not None and bool(conf.settings.configured)


def django_installed() -> bool:
    """Whether Django is configured and drainer is one of its installed apps: then its
    database is drainer's, before DRAINER_DATABASE_URL and DATABASE_URL."""
    if not django_configured():
        return False
    return any(app == APP or app.startswith(APP + ".")
               for app in getattr(_settings(), "INSTALLED_APPS", ()))


def django_alias() -> str:
    """The alias in DATABASES of drainer's database: the DRAINER setting's DATABASE,
    else the one the drainer task backends' OPTIONS name, else "default"."""
    settings = _settings()
    given = getattr(settings, "DRAINER", None) or {}
    if not isinstance(given, dict) or set(given) - DJANGO_SETTINGS:
        raise ConfigError(f"the DRAINER setting must be a dict of {sorted(DJANGO_SETTINGS)}, "
                          f"not {given!r}")
    tasks: dict[str, Any] = getattr(settings, "TASKS", None) or {}
    _load_apps()  # a backend's module may import models
    named = {params["OPTIONS"]["DATABASE"] for params in tasks.values()
             if _drainer_backend(params.get("BACKEND", ""))
             and "DATABASE" in (params.get("OPTIONS") or {})}
    if "DATABASE" in given:
        named.add(given["DATABASE"])
    if len(named) > 1:
        raise ConfigError(f"drainer's database is named twice in Django's settings: "
                          f"{sorted(named)}; name it once, in DRAINER = {{'DATABASE': ...}}")
    return named.pop() if named else "default"


def _settings() -> Any:
    """Django's settings, loaded: a settings module that fails to import (or does not
    exist) is a ConfigError that names it, not a traceback."""
    from django.conf import settings

    try:
        settings.DATABASES  # noqa: B018 - the first read imports the module
    except Exception as exc:
        name = os.environ.get("DJANGO_SETTINGS_MODULE") or "configured in code"
        raise ConfigError(f"Django's settings ({name}) cannot be loaded: "
                          f"{describe(exc)}") from exc
    return settings


def _load_apps() -> None:
    """Django's apps loaded (django.setup(), as manage.py does first), unless they are
    loading now."""
    from django.apps import apps

    if not apps.ready and not apps.loading:
        import django

        django.setup()


def _drainer_backend(path: str) -> bool:
    """Whether a TASKS backend is drainer's (or a subclass)."""
    from django.core.exceptions import AppRegistryNotReady
    from django.utils.module_loading import import_string

    try:
        return bool(getattr(import_string(path), "drainer_backend", False))
    except (ImportError, AppRegistryNotReady):
        return False


def django_url() -> str:
    """The libpq connection string of drainer's Django database, as Django connects to
    it (a test run's test database included)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections

    alias = django_alias()
    if alias not in connections.settings:
        raise ConfigError(f"drainer's database {alias!r} is not one of Django's DATABASES "
                          f"({', '.join(connections.settings)})")
    database = connections[alias]
    if database.vendor != "postgresql":
        raise ConfigError(f"Django's database {alias!r} is {database.vendor}, not PostgreSQL")
    try:  # as Django connects: NAME None is the `postgres` database, say
        params = database.get_connection_params()
    except ImproperlyConfigured as exc:
        raise ConfigError(f"Django's database {alias!r}: {exc}") from exc
    keywords = {o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults()}
    keywords.discard("client_encoding")  # Django's UTF8; drainer sets its own
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items()
                                             if k in keywords and v not in (None, "")})
