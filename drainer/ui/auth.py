"""Who may use the dashboard: whoever holds its token. The URL `drainer ui` prints
carries it (`?token=`); that first visit trades it for a cookie and a redirect to the
same page without it, so it stays out of the address bar and history; scripts send
`Authorization: Bearer TOKEN`. Actions are POSTs that carry a CSRF token derived from
it, which another site's form cannot know (the cookie is also SameSite=Strict)."""

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from urllib.parse import urlencode

from starlette.requests import Request

COOKIE = "drainer_ui"
HEADER = "authorization"


def new_token() -> str:
    return secrets.token_urlsafe(24)


class Guard:
    """Checks a request's token (query, cookie or bearer) and its CSRF field."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.cookie = self._derived("cookie")  # the cookie holds this, not the token
        self.csrf = self._derived("csrf")

    def _derived(self, purpose: str) -> str:
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @staticmethod
    def _same(given: str | None, expected: str) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), expected.encode())

    def bearer(self, request: Request) -> bool:
        kind, _, value = request.headers.get(HEADER, "").partition(" ")
        return kind.lower() == "bearer" and self._same(value.strip(), self.token)

    def allows(self, request: Request) -> bool:
        """A valid bearer token or cookie (the query's token is `exchanges`')."""
        return self.bearer(request) or self._same(request.cookies.get(COOKIE), self.cookie)

    def exchanges(self, request: Request) -> bool:
        """Whether the URL carries the right token, to be traded for the cookie."""
        return self._same(request.query_params.get("token"), self.token)

    def form_ok(self, request: Request, form: Mapping[str, str]) -> bool:
        """A POST's CSRF check: a script with the bearer token needs none (no browser
        sends that header by itself); a browser's form carries the field, and comes
        from this origin when it says where it comes from."""
        if self.bearer(request):
            return True
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return False
        return self._same(form.get("csrf"), self.csrf)


def without_token(request: Request) -> str:
    """The request's path and query, less the token."""
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    return request.url.path + (f"?{urlencode(rest)}" if rest else "")
