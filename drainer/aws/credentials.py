"""Where the function's database connection comes from.

In order: a Secrets Manager secret in the standard RDS JSON shape
(`DRAINER_DATABASE_SECRET_ARN`, cached for `DRAINER_SECRET_TTL` seconds so a warm
container does not call Secrets Manager on every run), else `DRAINER_DATABASE_URL`
or `DATABASE_URL` (libpq's PG* variables fill what they leave out). With
`DRAINER_DATABASE_IAM_AUTH` on, the password is an RDS IAM token instead,
generated for every connection (tokens live 15 minutes) and TLS is required.
"""

import json
import os
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .. import clock, config, settings
from ..errors import ConfigError, DatabaseUnavailable
from . import clients

_TLS_VERIFYING = ("verify-ca", "verify-full")  # stronger than "require": kept as given
_secrets: dict[str, tuple[float, str]] = {}  # ARN -> (fetched at, conninfo), per process


@dataclass(frozen=True)
class Credentials:
    url: str | None = None
    secret_arn: str | None = None
    iam: bool = False
    secret_ttl: float = settings.DEFAULT_SECRET_TTL

    @classmethod
    def from_env(cls) -> "Credentials":
        """The function's configuration, or ConfigError when nothing names a database."""
        secret_arn = settings.DATABASE_SECRET_ARN.resolve()
        url = config.function_url(secret_arn, settings.DATABASE_SECRET_ARN.env)
        return cls(url=url, secret_arn=secret_arn,
                   iam=settings.DATABASE_IAM_AUTH.resolve(),
                   secret_ttl=settings.SECRET_TTL.resolve())

    def conninfo(self) -> str:
        """Parameters for the next connection (a fresh IAM token each time)."""
        base = self._secret(self.secret_arn) if self.secret_arn else self.url or ""
        return _with_iam_token(base) if self.iam else base

    def forget(self) -> bool:
        """Drop the cached secret (after the server refused it: it may have been
        rotated); True when there was one, so one more try is worth it."""
        return self.secret_arn is not None and _secrets.pop(self.secret_arn, None) is not None

    def _secret(self, arn: str) -> str:
        cached = _secrets.get(arn)
        if cached and clock.monotonic() - cached[0] < self.secret_ttl:
            return cached[1]
        conninfo = _from_rds_secret(arn, _fetch(arn))
        _secrets[arn] = (clock.monotonic(), conninfo)
        return conninfo


def forget_secrets() -> None:
    """Drop every cached secret, so the next connection reads its secret again (for
    tests: each one's secrets are its own; see drainer.testing.reset)."""
    _secrets.clear()


def _fetch(arn: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        secret: str = clients.get("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]
        return secret
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            raise ConfigError(f"the database secret {arn} does not exist; check "
                              "DRAINER_DATABASE_SECRET_ARN") from None
        if code == "AccessDeniedException":
            raise ConfigError(f"not allowed to read the database secret {arn}; grant the "
                              "function secretsmanager:GetSecretValue on it") from None
        raise DatabaseUnavailable(f"could not read the database secret {arn}: {code}") from None
    except KeyError:
        raise ConfigError(f"the database secret {arn} has no SecretString") from None
    except BotoCoreError as exc:
        raise DatabaseUnavailable(f"could not read the database secret {arn}: {exc}") from None


def _from_rds_secret(arn: str, text: str) -> str:
    """conninfo from the RDS secret shape: username, password, host, port, dbname."""
    try:
        secret = json.loads(text)
        params = {"host": secret["host"], "user": secret["username"],
                  "password": secret["password"]}
    except (ValueError, TypeError, KeyError):
        raise ConfigError(f"the database secret {arn} is not in the RDS shape: expected JSON "
                          "with username, password and host (port, dbname optional)") from None
    for key, name in (("port", "port"), ("dbname", "dbname")):
        if secret.get(key):
            params[name] = str(secret[key])
    return make_conninfo(**params)


def _with_iam_token(base: str) -> str:
    """`base` with an RDS IAM token as the password and TLS required."""
    params = conninfo_to_dict(base)
    host = params.get("host") or os.environ.get("PGHOST")
    user = params.get("user") or os.environ.get("PGUSER")
    port = int(params.get("port") or os.environ.get("PGPORT") or 5432)
    if not host or not user:
        raise ConfigError("RDS IAM authentication needs a host and a user: give them in "
                          "DATABASE_URL (no password), the secret, or PGHOST and PGUSER")
    rds = clients.get("rds")
    token = rds.generate_db_auth_token(DBHostname=host, Port=port, DBUsername=user,
                                       Region=rds.meta.region_name)
    mode = params.get("sslmode") or os.environ.get("PGSSLMODE")
    return make_conninfo(base, password=token,
                         sslmode=mode if mode in _TLS_VERIFYING else "require")
