"""Where the function's database connection comes from.

In order: a Secret Manager secret holding the database URL (`DRAINER_DATABASE_SECRET`,
a secret's or a version's resource name; cached for `DRAINER_SECRET_TTL` seconds so a
warm instance does not call Secret Manager on every run), else `DRAINER_DATABASE_URL`
or `DATABASE_URL` (which `gcloud ... --set-secrets` can fill from Secret Manager at
the instance's start; libpq's PG* variables fill what they leave out).
"""

from dataclasses import dataclass

from .. import clock, config, settings
from ..errors import ConfigError, DatabaseUnavailable
from . import clients

_secrets: dict[str, tuple[float, str]] = {}  # version name -> (fetched at, URL), per process


@dataclass(frozen=True)
class Credentials:
    url: str | None = None
    secret: str | None = None  # a secret version's resource name
    secret_ttl: float = settings.DEFAULT_SECRET_TTL

    @classmethod
    def from_env(cls) -> "Credentials":
        """The function's configuration, or ConfigError when nothing names a database."""
        secret = settings.DATABASE_SECRET.resolve()
        url = config.function_url(secret, settings.DATABASE_SECRET.env)
        return cls(url=url, secret=secret and version_of(secret),
                   secret_ttl=settings.SECRET_TTL.resolve())

    def conninfo(self) -> str:
        if self.secret is None:
            return self.url or ""
        cached = _secrets.get(self.secret)
        if cached and clock.monotonic() - cached[0] < self.secret_ttl:
            return cached[1]
        url = _fetch(self.secret)
        _secrets[self.secret] = (clock.monotonic(), url)
        return url

    def forget(self) -> bool:
        """Drop the cached secret (after the server refused it: it may have been
        rotated); True when there was one, so one more try is worth it."""
        return self.secret is not None and _secrets.pop(self.secret, None) is not None


def version_of(secret: str) -> str:
    """`projects/P/secrets/S` or `.../versions/V`: the version to read (latest unless
    named); ConfigError for anything else."""
    parts = secret.strip("/").split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "secrets":
        parts += ["versions", "latest"]
    if len(parts) != 6 or parts[0::2] != ["projects", "secrets", "versions"] or not all(parts):
        raise ConfigError(f"DRAINER_DATABASE_SECRET={secret!r}: expected "
                          "projects/PROJECT/secrets/NAME, optionally /versions/VERSION")
    return "/".join(parts)


def forget_secrets() -> None:
    """Drop every cached secret (for tests; see drainer.testing.reset)."""
    _secrets.clear()


def _fetch(name: str) -> str:
    from google.api_core import exceptions

    try:
        response = clients.secrets().access_secret_version(name=name, timeout=clients.TIMEOUT)
    except exceptions.NotFound:
        raise ConfigError(f"the database secret {name} does not exist; check "
                          "DRAINER_DATABASE_SECRET") from None
    except exceptions.PermissionDenied:
        raise ConfigError(f"not allowed to read the database secret {name}; grant the "
                          "function's service account roles/secretmanager.secretAccessor "
                          "on it") from None
    except exceptions.GoogleAPIError as exc:
        raise DatabaseUnavailable(f"could not read the database secret {name}: "
                                  f"{type(exc).__name__}") from None
    try:
        return response.payload.data.decode().strip()
    except UnicodeDecodeError:
        raise ConfigError(f"the database secret {name} is not text: it must hold the "
                          "database URL") from None
