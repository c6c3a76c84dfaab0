"""Who may start a drain over HTTP: a request signed with the shared secret, or one
bearing the token. Pure checks on the headers and body, made before any database is
touched, so a stranger's request never wakes it.

A signed request carries `Drainer-Timestamp` (Unix seconds) and `Drainer-Signature`
(hex HMAC-SHA256, keyed by the secret, of the timestamp, a dot and the body). A
timestamp more than the window away from now is refused; a replay within the window
is refused by the caller, which remembers signatures in the database. A bearer token
(`Authorization: Bearer ...`) is what Vercel cron and Cloud Scheduler can send.
"""

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

TIMESTAMP = "drainer-timestamp"
SIGNATURE = "drainer-signature"
AUTHORIZATION = "authorization"


class Refused(Exception):  # noqa: N818 - a refusal, answered with its status
    """A request that may not drain: `status` and a message for the caller."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Keys:
    """The shared secret and the bearer token; either may be unset, not both."""

    secret: str | None
    token: str | None
    window: float  # seconds


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The signature of `body` sent at `timestamp`: what a caller computes."""
    message = timestamp.encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check(keys: Keys, headers: Mapping[str, str], body: bytes, now: float) -> str | None:
    """The request's signature to remember (None for a bearer token), or Refused:
    503 when no key is configured (never open), 401 otherwise."""
    if not keys.secret and not keys.token:
        raise Refused(503, "the HTTP entry point has no key: set DRAINER_HTTP_SECRET "
                           "(signed requests) or DRAINER_HTTP_TOKEN (a bearer token)")
    if SIGNATURE in headers:
        return _signed(keys, headers, body, now)
    scheme, _, token = headers.get(AUTHORIZATION, "").partition(" ")
    if scheme.lower() == "bearer" and token:
        if not keys.token:
            raise Refused(401, "bearer tokens are not accepted here: sign the request")
        if not hmac.compare_digest(token.strip().encode(), keys.token.encode()):
            raise Refused(401, "the bearer token is wrong")
        return None
    raise Refused(401, f"unauthenticated: send {SIGNATURE} and {TIMESTAMP} headers, or "
                       "Authorization: Bearer with the token")


def _signed(keys: Keys, headers: Mapping[str, str], body: bytes, now: float) -> str:
    if not keys.secret:
        raise Refused(401, "signed requests are not accepted here: send the bearer token")
    stamp = headers.get(TIMESTAMP, "").strip()
    if not stamp.isascii() or not stamp.isdigit():
        raise Refused(401, f"{TIMESTAMP} must be the Unix time in whole seconds")
    given = headers[SIGNATURE].strip().removeprefix("sha256=").lower()
    if not hmac.compare_digest(given.encode(), sign(keys.secret, stamp, body).encode()):
        raise Refused(401, "the signature does not match the body and timestamp")
    if abs(now - int(stamp)) > keys.window:
        raise Refused(401, f"the timestamp is more than {keys.window:g} s away from now: "
                           "sign each request when it is sent")
    return given
