"""Failures a new user can see without psql: one stderr line per failed attempt (what,
why, what happens next), the traceback with --verbose, a hint at the end of a drain
with failures, `drainer failed`, `drainer show ID` and the most frequent errors in
`stats`. Real CLI processes on a real PostgreSQL; the tasks are tests/tasks/failing.py."""

import json
import re
from datetime import datetime, timedelta

import psycopg

import drainer
from drainer.errors import MAX_ERROR
from drainer.storage import roundtrip, writeback
from tests.helpers import DATABASE_OPTIONS, HAND_MADE_TABLE, clean_env, offered, run_cli

ATTEMPT = re.compile(r"^drainer: job \d+ \(queue \S+\) failed, attempt \d+ of \d+: ")


def drain(db_url: str, *extra: str, command: str = "drain", env: dict | None = None):
    result = run_cli(command, "--database-url", db_url, "--tasks", "failing", *extra, env=env)
    assert result.returncode == 0, result.stderr
    return result


def failure_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ATTEMPT.match(line)]


def line_of(stderr: str, job: int) -> str:
    [line] = [line for line in failure_lines(stderr) if line.startswith(f"drainer: job {job} ")]
    return line


# --- the line per failed attempt ------------------------------------------------------


def test_each_failed_attempt_logs_one_line_saying_what_happens_next(conn, db_url):
    retry = drainer.enqueue(conn, "fails", {"message": "SMTP 451: try again later"},
                            max_attempts=3)
    final = drainer.enqueue(conn, "fails", {"message": "no such mailbox"}, max_attempts=1)
    lines = drainer.enqueue(conn, "fails", {"message": "first\nsecond"}, max_attempts=1)
    result = drain(db_url)
    assert len(failure_lines(result.stderr)) == 3
    head, at = line_of(result.stderr, retry).split("; retry at ")
    assert head == (f"drainer: job {retry} (queue fails) failed, attempt 1 of 3: "
                    "RuntimeError: SMTP 451: try again later")
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", (retry,)).fetchone()[0]
    assert datetime.fromisoformat(at) == run_at  # the database's own retry time
    assert line_of(result.stderr, final) == (
        f"drainer: job {final} (queue fails) failed, attempt 1 of 1: "
        "RuntimeError: no such mailbox; failed for good")
    assert line_of(result.stderr, lines).endswith(  # still one line
        "RuntimeError: first\\nsecond; failed for good")


def test_the_line_masks_passwords_and_is_bounded(conn, db_url):
    secret = "s3cret-Pw9"
    leaky = drainer.enqueue(conn, "fails", {"message": f"cannot reach postgresql://app:{secret}"
                                            f"@db.example/app, or with password={secret} either"},
                            max_attempts=1)
    huge = drainer.enqueue(conn, "fails", {"message": "x" * 100_000}, max_attempts=1)
    result = drain(db_url, "--verbose")  # the traceback is masked and bounded too
    assert secret not in result.stderr
    assert line_of(result.stderr, leaky).endswith(
        "postgresql://app:***@db.example/app, or with password=*** either; failed for good")
    error = line_of(result.stderr, huge).split(" of 1: ", 1)[1].removesuffix("; failed for good")
    assert error.startswith("RuntimeError: xxx") and error.endswith("…")
    assert len(error) == MAX_ERROR
    assert "x" * 30_000 not in result.stderr


def test_a_handler_past_its_timeout_is_a_failed_attempt_too(conn, db_url):
    job = drainer.enqueue(conn, "hangs", {}, max_attempts=1)
    result = drain(db_url, "--queue", "hangs")
    assert line_of(result.stderr, job) == (
        f"drainer: job {job} (queue hangs) failed, attempt 1 of 1: TimeoutError: the handler "
        "ran longer than its 0.3 s timeout and was abandoned; failed for good")


def test_a_failure_no_longer_ours_is_not_logged_as_one(conn, db_url):
    job = drainer.enqueue(conn, "cancels_itself", {"url": db_url})
    result = drain(db_url, "--queue", "cancels_itself")
    assert failure_lines(result.stderr) == []
    assert "jobs lost: 1" in result.stderr
    assert conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job,)
                        ).fetchone()[0] == "cancelled"


def test_verbose_adds_the_handlers_traceback_which_is_never_stored(conn, db_url):
    job = drainer.enqueue(conn, "fails", {"message": "boom"}, max_attempts=1)
    quiet = drain(db_url)
    assert line_of(quiet.stderr, job) and "Traceback" not in quiet.stderr
    for command, extra, env in (("drain", ["--verbose"], None),
                                ("work", ["--max-runtime", "8"], clean_env(DRAINER_VERBOSE="1"))):
        drainer.requeue(conn, ids=[job])
        result = drain(db_url, *extra, command=command, env=env)
        after = result.stderr.split(line_of(result.stderr, job), 1)[1]
        assert after.lstrip("\n").startswith("  Traceback (most recent call last):"), command
        assert "in _deliver" in after and "raise RuntimeError(message)" in after
        assert "drainer/engine/" not in after  # the handler's frames, not ours
        assert "  RuntimeError: boom" in after
    assert conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job,)
                        ).fetchone()[0] == "RuntimeError: boom"


def test_settle_returns_each_failures_new_run_at(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, timedelta(minutes=5))
    settled = roundtrip.settle(conn, (), [(job, "boom")], ())
    run_at = conn.execute("SELECT run_at FROM jobs").fetchone()[0]
    assert list(settled.failed) == [job.token]
    assert (settled.failed[job.token].status, settled.failed[job.token].run_at) == (
        "queued", run_at)
    again = writeback.settle_again(conn, (), [(job, "boom")])  # its first answer was lost
    assert (again.failed[job.token].status, again.failed[job.token].run_at) == ("queued", run_at)


# --- the hint at the end of a drain ---------------------------------------------------


def test_a_drain_with_failures_ends_with_where_to_look(conn, db_url):
    drainer.enqueue(conn, "fails", {"message": "boom"})
    result = drain(db_url)
    last = result.stderr.strip().splitlines()[-1]
    assert "`drainer failed`" in last and "`drainer show ID`" in last
    assert json.loads(result.stdout.splitlines()[-1])["retried"] == 1  # stdout unchanged
    clean = drain(db_url)  # the retry is not due yet: nothing failed this time
    assert "drainer failed" not in clean.stderr


# --- drainer failed -------------------------------------------------------------------


LONG = "KeyError: " + "k" * 500 + "\nthe end"


def seed(conn: psycopg.Connection) -> dict[str, int]:
    """Three failed jobs (oldest first), a retrying one and a done one."""
    rows = conn.execute("""
        INSERT INTO jobs (queue, payload, status, attempts, max_attempts, last_error,
                          created_at)
        VALUES ('mail', '{"to": "a@example.com"}', 'failed', 5, 5,
                'RuntimeError: SMTP 550 mailbox unavailable', now() - interval '3 hours'),
               ('mail', '{}', 'failed', 2, 2, %(long)s, now() - interval '2 hours'),
               ('pdf', '{}', 'failed', 1, 3, E'ValueError: bad page\nsecond line',
                now() - interval '1 hour'),
               ('mail', '{}', 'queued', 1, 5, 'RuntimeError: retrying', now()),
               ('mail', '{}', 'done', 1, 5, NULL, now())
        RETURNING id""", {"long": LONG}).fetchall()
    return dict(zip(("smtp", "long", "pdf", "retrying", "done"), (r[0] for r in rows),
                    strict=True))


def no_columns(**extra: str) -> dict:
    env = clean_env(**extra)
    if "COLUMNS" not in extra:
        env.pop("COLUMNS", None)
    return env


def test_failed_lists_failed_jobs_newest_first_one_line_each(conn, db_url):
    ids = seed(conn)
    url = ["--database-url", db_url]
    result = run_cli("failed", *url, env=no_columns())
    assert result.returncode == 0, result.stderr
    head, *rows = result.stdout.splitlines()
    assert head.split() == ["id", "queue", "attempts", "created", "last", "error"]
    assert [int(r.split()[0]) for r in rows] == [ids["pdf"], ids["long"], ids["smtp"]]
    assert all(len(line) <= 120 for line in [head, *rows])
    pdf, long, smtp = rows
    assert pdf.split()[1:3] == ["pdf", "1/3"] and pdf.endswith("ValueError: bad page second line")
    assert long.split()[1:3] == ["mail", "2/2"] and long.endswith("kkk…")
    created = conn.execute("SELECT created_at FROM jobs WHERE id = %s", (ids["smtp"],)
                           ).fetchone()[0]
    assert datetime.fromisoformat(smtp.split()[3]) == created.replace(microsecond=0)
    assert smtp.endswith("RuntimeError: SMTP 550 mailbox unavailable")
    narrow = run_cli("failed", *url, env=no_columns(COLUMNS="80")).stdout.splitlines()
    assert all(len(line) <= 80 for line in narrow) and narrow[2].endswith("…")


def test_failed_filters_limits_and_gives_full_errors_in_json(conn, db_url):
    ids = seed(conn)
    url = ["--database-url", db_url]
    pdf = run_cli("failed", "--queue", "pdf", *url).stdout.splitlines()
    assert [int(r.split()[0]) for r in pdf[1:]] == [ids["pdf"]]
    limited = run_cli("failed", "--limit", "1", *url)
    assert [int(r.split()[0]) for r in limited.stdout.splitlines()[1:2]] == [ids["pdf"]]
    assert "--limit" in limited.stdout.splitlines()[-1]  # says more are there
    data = json.loads(run_cli("failed", "--json", "--queue", "mail", *url).stdout)
    assert [j["id"] for j in data["jobs"]] == [ids["long"], ids["smtp"]]
    long = data["jobs"][0]
    assert set(long) == {"id", "queue", "attempts", "max_attempts", "created_at", "last_error"}
    assert (long["queue"], long["attempts"], long["max_attempts"], long["last_error"]) == (
        "mail", 2, 2, LONG)
    assert run_cli("failed", "--queue", "none", *url).stdout.strip() == "(no failed jobs)"
    assert "show ID" in " ".join(run_cli("failed", "--help").stdout.split())


def test_failed_and_show_offer_only_their_options():
    assert offered("failed") == DATABASE_OPTIONS | {"--queue", "--limit", "--json"}
    assert offered("show") == DATABASE_OPTIONS | {"--json"}


# --- drainer show ---------------------------------------------------------------------


def columns(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum", (table,))]


def test_show_prints_one_job_whole(conn, db_url):
    ids = seed(conn)
    url = ["--database-url", db_url]
    result = run_cli("show", str(ids["smtp"]), *url)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for column in columns(conn, "jobs"):  # done_at included
        assert re.search(rf"^{column} ", text, re.MULTILINE), column
    assert re.search(r"^payload +\{\n +\"to\": \"a@example.com\"\n +\}$", text, re.MULTILINE)
    assert re.search(r"^attempts +5$", text, re.MULTILINE)
    assert re.search(r"^locked_until +-$", text, re.MULTILINE)
    full = run_cli("show", str(ids["long"]), *url).stdout
    assert "k" * 500 in full and re.search(r"^ +the end$", full, re.MULTILINE)
    data = json.loads(run_cli("show", str(ids["long"]), "--json", *url).stdout)
    assert list(data) == columns(conn, "jobs")
    assert (data["payload"], data["last_error"], data["status"]) == ({}, LONG, "failed")


def test_show_finds_archived_jobs_and_says_when_there_is_no_such_job(conn, db_url):
    conn.execute("INSERT INTO jobs_archive (id, queue, payload, status, run_at, attempts, "
                 "max_attempts, created_at) VALUES (777, 'mail', '{\"n\": 1}', 'done', now(), "
                 "1, 5, now())")
    url = ["--database-url", db_url]
    archived = run_cli("show", "777", *url)
    assert archived.returncode == 0 and "archived" in archived.stdout.splitlines()[0]
    assert set(json.loads(run_cli("show", "777", "--json", *url).stdout)) == set(
        columns(conn, "jobs_archive"))
    missing = run_cli("show", "999999", *url)
    assert missing.returncode == 1 and missing.stdout == ""
    [line] = missing.stderr.splitlines()
    assert line.startswith("drainer: error: no job 999999") and "Traceback" not in line


def test_show_says_when_a_running_jobs_lease_ends_or_that_it_ran_out(conn, db_url):
    def running(lease: str) -> int:
        return conn.execute("INSERT INTO jobs (payload, status, attempts, locked_until) "
                            "VALUES ('{}', 'running', 1, now() + %s::interval) RETURNING id",
                            (lease,)).fetchone()[0]

    def lease_line(job: int) -> list[str]:
        result = run_cli("show", str(job), "--database-url", db_url)
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines() if line.startswith("lease:")]

    # Leases days long, or days gone: a slow test run changes none of these figures.
    live, gone = running("2 days"), running("-3 days")
    [ends] = lease_line(live)
    assert ends.startswith("lease: ends in 2.0d (locked_until, by the database clock)")
    [ran_out] = lease_line(gone)
    assert ran_out.startswith("lease: ran out 3.0d ago") and "drainer reap" in ran_out
    run_cli("cancel", str(live), "--database-url", db_url)
    [cancelled] = lease_line(live)
    assert cancelled.startswith("lease: ends in 2.0d: cancelled while running")
    conn.execute("UPDATE jobs SET locked_until = 'infinity' WHERE id = %s", (gone,))
    assert lease_line(gone) == []  # another producer's lease, which no time ends
    conn.execute("UPDATE jobs SET status = 'done', locked_until = NULL WHERE id = %s", (gone,))
    assert lease_line(gone) == []


def test_failed_and_show_work_on_a_hand_made_table(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        job = conn.execute("INSERT INTO jobs (payload, status, last_error) "
                           "VALUES ('{}', 'failed', 'boom') RETURNING id").fetchone()[0]
        url = ["--database-url", empty_db_url]
        assert json.loads(run_cli("failed", "--json", *url).stdout)["jobs"][0]["id"] == job
        data = json.loads(run_cli("show", str(job), "--json", *url).stdout)
        assert list(data) == columns(conn, "jobs") and "done_at" not in data
        assert run_cli("show", "999", *url).returncode == 1  # no archive table to look in


# --- stats: the most frequent errors --------------------------------------------------


def test_stats_shows_each_queues_most_frequent_errors(conn, db_url):
    def add(queue: str, status: str, error: str, n: int) -> int:
        return conn.execute(
            "WITH added AS (INSERT INTO jobs (queue, payload, status, attempts, last_error) "
            "SELECT %s, '{}', %s, 1, %s FROM generate_series(1, %s) RETURNING id) "
            "SELECT max(id) FROM added",
            (queue, status, error, n)).fetchone()[0]

    add("mail", "failed", "E1 gone", 3)
    latest_e1 = add("mail", "queued", "E1 gone", 1)  # failed and retrying count together
    add("mail", "queued", "E2 slow", 2)
    add("mail", "running", "E3 older", 1)
    latest_e4 = add("mail", "failed", "E4 newer", 1)  # a tie: the newest first
    add("mail", "done", "E9 recovered", 9)  # succeeded since: not an error any more
    add("mail", "failed", "cancelled", 9)  # withdrawn, not an error
    latest_p1 = add("pdf", "failed", "P1 " + "p" * 300, 1)
    url = ["--database-url", db_url]
    data = json.loads(run_cli("stats", "--json", *url).stdout)
    mail = data["top_errors"]["mail"]
    assert [(e["error"], e["jobs"]) for e in mail] == [("E1 gone", 4), ("E2 slow", 2),
                                                       ("E4 newer", 1)]
    assert (mail[0]["latest_id"], mail[2]["latest_id"]) == (latest_e1, latest_e4)
    assert data["top_errors"]["pdf"] == [{"error": "P1 " + "p" * 300, "jobs": 1,
                                          "latest_id": latest_p1}]
    text = run_cli("stats", *url).stdout
    assert "most frequent errors" in text
    assert re.search(rf"^mail +4 +job {latest_e1} +E1 gone$", text, re.MULTILINE)
    assert re.search(rf"^ +1 +job {latest_e4} +E4 newer$", text, re.MULTILINE)
    [pdf] = [line for line in text.splitlines() if f"job {latest_p1}" in line]
    assert pdf.startswith("pdf") and pdf.endswith("…") and len(pdf) <= 120
