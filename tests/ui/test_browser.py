"""`drainer ui` in a real browser: Debian's chromium, headless, driven by Playwright
(which downloads no browser of its own here). A person loads each page, follows a
job from the list to its detail, requeues it and a group of failures; and a tab left
open with nothing clicked costs the database nothing: no statement, no session, even
with the browser's clock moved an hour on. Screenshots are saved as the test's
artifacts (in DRAINER_UI_SCREENSHOTS when set: docs/images holds the README's)."""

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import drainer
from tests.helpers import clean_env, unavailable
from tests.test_footprint import dbname_of, reset_statement_counts, statements
from tests.ui.conftest import started, stop

CHROMIUM = os.environ.get("DRAINER_TEST_CHROMIUM", "/usr/bin/chromium")
HOUR = 3_600_000  # ms
try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:
    unavailable("browser", "playwright is not installed; pip install -e '.[dev]'")
if not shutil.which(CHROMIUM):
    unavailable("browser", f"no chromium at {CHROMIUM}: apt-get install -y chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        found = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield found
        found.close()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("DRAINER_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def seed(conn: psycopg.Connection) -> dict[str, list[int]]:
    """A day's queues: done, ready, scheduled, running and failed jobs, a limit and a
    schedule."""
    drainer.enqueue_many(conn, "email", [{"to": f"user{i}@example.com"} for i in range(40)])
    drainer.enqueue_many(conn, "reports", [{"report": "daily", "day": i} for i in range(6)])
    drainer.enqueue(conn, "reports", {"report": "monthly"}, delay=3600, key="monthly-2026-12")
    conn.execute("UPDATE jobs SET status = 'done', attempts = 1 WHERE queue = 'email' "
                 "AND id % 4 <> 0")
    conn.execute("UPDATE jobs SET status = 'running', attempts = 1, "
                 "locked_until = now() + interval '5 minutes' WHERE id = 4")
    failed = {}
    for queue, error, n in (("email", "SMTPServerDisconnected: Connection unexpectedly "
                             "closed", 3), ("images", "OSError: cannot identify image "
                                            "file 'upload/7f3a.heic'", 2)):
        ids = [drainer.enqueue(conn, queue, {"n": i}, max_attempts=3) for i in range(n)]
        conn.execute("UPDATE jobs SET status = 'failed', attempts = 3, last_error = %s "
                     "WHERE id = ANY(%s)", (error, ids))
        failed[queue] = ids
    conn.execute("INSERT INTO drainer_limits (queue, concurrency) VALUES ('email', 4)")
    conn.execute("INSERT INTO drainer_schedules (name, queue, cron, tz, catch_up, payload, "
                 "definition) VALUES ('nightly-report', 'reports', '0 3 * * *', "
                 "'Europe/Paris', 'latest', '{}', 'seeded')")
    return failed


@pytest.fixture
def dashboard(db_url) -> Iterator[str]:
    proc, url = started("--database-url", db_url, env=clean_env(PYTHONUNBUFFERED="1"))
    yield url
    stop(proc)


def status(conn: psycopg.Connection, job_id: int) -> str:
    return conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()[0]


def test_a_person_follows_a_failed_job_and_requeues_it(browser, dashboard, conn, shots):
    failed = seed(conn)
    page: Page = browser.new_page(viewport={"width": 1280, "height": 760})
    page.goto(dashboard)
    assert page.locator("h1").inner_text() == "Queues"
    assert "?token=" not in page.url  # traded for the cookie
    page.screenshot(path=shots / "ui-queues.png", full_page=True)

    nav = page.get_by_role("navigation")
    nav.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_label("State").select_option("failed")
    page.get_by_label("Queue", exact=True).fill("images")
    page.get_by_role("button", name="Filter").click()
    page.screenshot(path=shots / "ui-jobs.png", full_page=True)
    job_id = failed["images"][-1]
    page.get_by_role("link", name=str(job_id), exact=True).click()
    assert page.locator("h1").inner_text().startswith(f"Job {job_id}")
    assert "cannot identify image file" in page.locator("pre.error").inner_text()
    page.screenshot(path=shots / "ui-job.png", full_page=True)
    page.get_by_role("button", name="Requeue").click()
    assert "1 of 1 requeued" in page.locator("h1").inner_text()
    assert status(conn, job_id) == "queued"

    nav.get_by_role("link", name="Failures").click()
    page.screenshot(path=shots / "ui-failures.png", full_page=True)
    page.get_by_role("link", name="Requeue…").first.click()  # the largest group: email's
    assert "Requeue these 3 failed jobs" in page.locator("form.confirm").inner_text()
    page.screenshot(path=shots / "ui-requeue-group.png", full_page=True)
    page.get_by_role("button", name="Requeue 3 jobs").click()
    assert "3 of 3 requeued" in page.locator("h1").inner_text()
    assert [status(conn, i) for i in failed["email"]] == ["queued"] * 3
    assert status(conn, failed["images"][0]) == "failed"

    for name, shot in (("Schedules", "ui-schedules.png"), ("Doctor", "ui-doctor.png")):
        nav.get_by_role("link", name=name).click()
        assert page.locator("h1").inner_text() == name
        page.screenshot(path=shots / shot, full_page=True)
    page.close()


def sessions(server, dbname: str) -> int:
    with server.admin() as admin:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                             (dbname,)).fetchone()[0]


def quiet_for_an_hour(page: Page, requests: list[str]) -> None:
    """Fire every timer the page would within an hour; then give a navigation one of
    them started a moment to show (a reload begins after the timer returns)."""
    page.clock.run_for(HOUR)
    page.wait_for_timeout(1000)
    assert requests == []


def test_an_open_tab_sends_nothing_until_asked(browser, server, dashboard, db_url, conn):
    seed(conn)
    conn.close()  # the test's own session, so that any left is the dashboard's
    dbname = dbname_of(db_url)
    page: Page = browser.new_page()
    page.clock.install()
    page.goto(dashboard)
    page.wait_for_load_state("networkidle")
    # Requests to the app's pages (its stylesheet, script and icon read no database).
    requests: list[str] = []
    page.on("request", lambda r: "/static/" in r.url or requests.append(r.url))
    reset_statement_counts(server)

    quiet_for_an_hour(page, requests)
    assert page.locator("h1").inner_text() == "Queues"
    assert statements(server, dbname) == 0
    assert sessions(server, dbname) == 0

    # Live mode, asked for, reads while it lasts (so the counts above would have seen
    # a page's reads), then stops by itself.
    page.get_by_role("button", name="Live for 5 minutes").click()
    with page.expect_navigation():
        page.clock.run_for(10_000)
    page.wait_for_load_state()
    assert requests and statements(server, dbname) > 0
    page.clock.fast_forward("06:00")  # past its 5 minutes: the pending reload is not done
    requests.clear()
    reset_statement_counts(server)
    quiet_for_an_hour(page, requests)
    assert statements(server, dbname) == 0
    assert sessions(server, dbname) == 0
    page.close()
