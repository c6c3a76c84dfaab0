"""`drainer ui` itself: it listens on 127.0.0.1 unless told otherwise, and prints a
URL that carries its token (DRAINER_UI_TOKEN's when set). That a drain never imports
the dashboard's libraries: tests/test_no_boto3.py."""

import http.cookiejar
import urllib.error
import urllib.request

import pytest

from tests.helpers import clean_env, run_cli
from tests.ui.conftest import started, stop


def browser() -> urllib.request.OpenerDirector:
    """A client that keeps cookies, as a browser does."""
    return urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def get(url: str, opener: urllib.request.OpenerDirector | None = None, **headers: str) -> int:
    try:
        with (opener or browser()).open(urllib.request.Request(url, headers=headers)) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_it_listens_on_localhost_and_prints_the_url_with_a_new_token(db_url):
    proc, url = started("--database-url", db_url)
    try:
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        token = url.split("?token=")[1]
        assert len(token) >= 32
        base = url.split("?")[0]
        visitor = browser()
        assert get(url, visitor) == 200  # redirected to the page, with the cookie
        assert get(base + "failed", visitor) == 200
        assert get(base) == 401  # another client, without it
        assert get(base + "jobs", Authorization=f"Bearer {token}") == 200
    finally:
        stop(proc)


def test_the_token_may_be_set_and_the_database_url_is_never_shown(db_url):
    proc, url = started("--database-url", db_url, "--read-only",
                        env=clean_env(DRAINER_UI_TOKEN="chosen-token-123"))
    try:
        assert url.endswith("?token=chosen-token-123")
        page = browser().open(url).read().decode()
        assert "read-only" in page and db_url not in page and "127.0.0.1" not in page
    finally:
        stop(proc)


@pytest.mark.parametrize("port", ["-1", "65536", "http"])
def test_a_bad_port_is_a_usage_error(port):
    result = run_cli("ui", "--port", port, "--database-url", "postgresql://x@127.0.0.1:1/x")
    assert result.returncode == 2 and "port" in result.stderr
