"""The command line as a user meets it: real processes, exit codes, messages, help."""

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drainer.commands import cli
from drainer.commands.cli import COMMANDS, settings_of
from drainer.db import connect
from drainer.errors import DatabaseUnavailable, DrainerError
from drainer.settings import MIN_LEASE, MIN_MAX_READY_AGE, MIN_MAX_RUNTIME, MIN_POLL_INTERVAL
from tests.cluster import free_port
from tests.helpers import (
    DATABASE_OPTIONS,
    ROOT,
    clean_env,
    count,
    offered,
    read_until,
    run_cli,
    summary_of,
    with_modules,
)

SECRET = "hunter2-Zq9"


def one_line_error(result, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("drainer: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def flat(text: str) -> str:
    return " ".join(text.split())  # help text wraps anywhere


def test_help_documents_every_command_and_option_with_its_variable():
    top = run_cli("--help")
    assert top.returncode == 0 and "DRAINER_" in top.stdout
    for command in COMMANDS:
        assert command in top.stdout
        text = run_cli(command, "--help").stdout
        assert settings_of(command) or command in ("demo", "db")  # the embedded database
        for setting in settings_of(command):
            assert setting.option in text and f"[{setting.env}]" in text, (command, setting.option)
    drain = run_cli("drain", "--help").stdout
    for flag in ("--database-url", "--queue", "--batch-size", "--lease", "--max-runtime",
                 "--concurrency", "--tasks", "--archive-after", "DRAINER_QUEUES"):
        assert flag in drain


DRAIN = {"--queue", "--tasks", "--batch-size", "--lease", "--max-runtime", "--concurrency",
         "--archive-after", "--archive-failed-after", "--event-loop", "--verbose"}
ARCHIVE = {"--archive-after", "--archive-failed-after"}


def test_each_command_offers_only_the_options_it_uses():
    members = {"--processes", "--budget-share", "--pool-size"}
    assert offered("drain") == DATABASE_OPTIONS | DRAIN | members | {"--connect-timeout"}
    assert offered("work") == DATABASE_OPTIONS | DRAIN | members | {"--listen-url",
                                                                    "--poll-interval"}
    assert offered("archive") == DATABASE_OPTIONS | ARCHIVE
    assert offered("doctor") == DATABASE_OPTIONS | {"--json", "--max-ready-age", "--tasks"}
    for command in ("migrate", "reap", "cancel"):
        assert offered(command) == DATABASE_OPTIONS
    assert offered("demo") == {"-h", "--help"}
    archive = run_cli("archive", "--help").stdout
    assert "--archive-after" in archive and "DRAINER_ARCHIVE_AFTER" in archive
    assert "DRAINER_ARCHIVE_FAILED_AFTER" in archive
    for flag in DRAIN - ARCHIVE:
        assert flag not in archive


def test_help_gives_the_bounds_of_durations():
    drain, work = flat(run_cli("drain", "--help").stdout), flat(run_cli("work", "--help").stdout)
    assert f"at least {MIN_LEASE:g}" in drain and f"at least {MIN_MAX_RUNTIME:g}" in drain
    assert f"at least {MIN_POLL_INTERVAL:g}" in work
    assert f"at least {MIN_MAX_READY_AGE:g}" in flat(run_cli("doctor", "--help").stdout)


def test_requeue_and_cancel_say_what_they_do_to_cancelled_and_running_jobs():
    assert "a queue's requeue leaves cancelled jobs alone" in flat(
        run_cli("requeue", "--help").stdout)
    assert "a running handler's result is then ignored" in flat(
        run_cli("cancel", "--help").stdout)


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and re.match(r"drainer \d+\.\d+", result.stdout)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments"),
    (["--batch-size", "-3"], "at least 1"),
    (["--concurrency", "lots"], "not a whole number"),
    (["--lease", "0"], "at least 1"),
    (["--lease", "0.0005"], "at least 1"),  # its heartbeat would spin
    (["--max-runtime", "0.05"], "at least 1"),
    (["work", "--poll-interval", "0.001"], "at least 1"),
    (["doctor", "--max-ready-age", "0"], "at least 1"),
    (["enqueue"], "QUEUE"),
])
def test_usage_errors_exit_2(args, message):
    assert message in one_line_error(run_cli(*args), 2)


def test_bad_environment_value_names_the_variable(db_url):
    env = clean_env(DRAINER_BATCH_SIZE="many")
    line = one_line_error(run_cli("drain", "--database-url", db_url, env=env), 2)
    assert "DRAINER_BATCH_SIZE" in line
    env = clean_env(DRAINER_LEASE="0.001")
    line = one_line_error(run_cli("drain", "--database-url", db_url, env=env), 2)
    assert "DRAINER_LEASE" in line and "at least 1" in line


# A bad variable, and the one command (with its arguments) that reads it.
READERS = {"DRAINER_LEASE": ["drain", "--tasks", "noop"],
           "DRAINER_BATCH_SIZE": ["drain", "--tasks", "noop"],
           "DRAINER_POLL_INTERVAL": ["work", "--tasks", "noop"],
           "DRAINER_MAX_READY_AGE": ["doctor"]}


@pytest.mark.parametrize("variable", sorted(READERS))
def test_a_bad_variable_breaks_only_the_command_that_reads_it(db_url, variable):
    env, url = clean_env(**{variable: "abc"}), ["--database-url", db_url]
    reader = READERS[variable]
    others = [["--version"], ["migrate", "--help"], ["drain", "--help"], ["archive", "--help"],
              ["migrate", *url], ["enqueue", "q", "{}", *url], ["archive", *url],
              ["stats", *url], *([["drain", "--tasks", "noop", *url]] * (reader[0] != "drain"))]
    for args in others:
        result = run_cli(*args, env=env)
        assert result.returncode == 0, (args, result.stderr)
    assert variable in one_line_error(run_cli(*reader, *url, env=env), 2)


def test_the_command_line_wins_over_a_bad_variable(db_url):
    env = clean_env(DRAINER_LEASE="abc", DRAINER_BATCH_SIZE="0")
    result = run_cli("drain", "--database-url", db_url, "--tasks", "noop", "--lease", "5",
                     "--batch-size", "3", env=env)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("slow", ["start", "task import"])
def test_max_runtime_counts_from_the_process_start(db_url, slow):
    """A start slower than --max-runtime (a heavy site-packages before drainer is
    imported, or a task module's import) leaves no time: nothing is claimed."""
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) VALUES ('{}')")
    env = clean_env(SLOW_START_SECONDS="2" if slow == "start" else "0",
                    SLOW_IMPORT_SECONDS="2" if slow == "task import" else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "slow_start"), env["PYTHONPATH"]])
    result = run_cli("drain", "--database-url", db_url, "--tasks", "slow_import",
                     "--max-runtime", "1", env=env)
    assert result.returncode == 0, result.stderr
    summary = summary_of(result.stdout)
    assert (summary["stopped"], summary["claimed"]) == ("deadline", 0)
    with connect(db_url) as conn:
        assert count(conn, "status = 'queued' AND attempts = 0") == 1


def test_an_error_after_work_was_done_prints_that_work_first(monkeypatch, capsys):
    """A drain that fails midway (say the database went away) still reports what it
    did: the summary as stdout's last line, then the error."""
    done = {"claimed": 2, "done": 2, "retried": 0, "failed": 0, "lost": 0, "reaped": 0,
            "archived": 0, "seconds": 0.1, "stopped": "empty", "next_due": None}

    def fail_midway(_args: object) -> None:
        error = DatabaseUnavailable("database unavailable (gone); check the URL")
        error.summary = done
        raise error

    monkeypatch.setitem(cli.RUN, "reap", fail_midway)
    code = cli.main(["reap", "--database-url", "postgresql://u@127.0.0.1:1/db"])
    out, err = capsys.readouterr()
    assert code == 3
    assert json.loads(out.strip().splitlines()[-1]) == done
    assert err.strip().splitlines() == ["drainer: error: database unavailable (gone); "
                                        "check the URL"]
    assert DrainerError.summary is None  # an error with no work done prints no summary


def test_no_tasks(db_url):
    line = one_line_error(run_cli("drain", "--database-url", db_url), 2)
    assert "--tasks" in line


def test_a_task_module_that_does_not_import_shows_its_error(db_url):
    line = one_line_error(run_cli("drain", "--database-url", db_url, "--tasks", "broken"), 2)
    assert "nonexistent_dependency_for_tests" in line and "broken" in line


def test_a_queue_with_no_task(db_url):
    line = one_line_error(run_cli("drain", "--database-url", db_url, "--tasks", "noop",
                                  "--queue", "mail"), 2)
    assert "'mail'" in line and "'default'" in line


def test_queues_from_the_environment_and_the_command_line_wins(db_url):
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (queue, payload) VALUES ('default', '{}'), ('other', '{}')")
    env = clean_env(DRAINER_QUEUES="other")
    first = run_cli("drain", "--database-url", db_url, "--tasks", "behave", env=env)
    assert summary_of(first.stdout)["done"] == 1
    second = run_cli("drain", "--database-url", db_url, "--tasks", "behave", "--queue",
                     "default", env=env)
    assert summary_of(second.stdout)["done"] == 1


def test_bad_url_exits_2_without_the_password():
    line = one_line_error(run_cli("migrate", "--database-url",
                                  f"postgresql://u:{SECRET}@localhost:notaport/x"), 2)
    assert SECRET not in line


def test_unreachable_database_exits_3_without_the_password():
    url = f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/db?connect_timeout=2"
    result = run_cli("drain", "--database-url", url, "--tasks", "noop",
                     "--connect-timeout", "0")  # one attempt: no line saying it waits
    line = one_line_error(result, 3)
    assert "unavailable" in line and SECRET not in result.stderr + result.stdout


def test_missing_schema_exits_3_and_says_to_migrate(empty_db_url):
    result = run_cli("drain", "--database-url", empty_db_url, "--tasks", "noop")
    assert "drainer migrate" in one_line_error(result, 3)
    assert result.stdout == ""  # no summary of work never done ("stopped": "empty")


def test_a_cloud_function_without_a_url_is_a_configuration_error():
    env = clean_env(AWS_LAMBDA_FUNCTION_NAME="drainer")
    assert "DATABASE_URL" in one_line_error(run_cli("drain", "--tasks", "noop", env=env), 2)


def test_database_url_from_the_environment(db_url):
    result = run_cli("drain", "--tasks", "noop", env=clean_env(DATABASE_URL=db_url))
    assert result.returncode == 0 and summary_of(result.stdout)["stopped"] == "empty"


def test_migrate_reports_the_version(empty_db_url):
    first = run_cli("migrate", "--database-url", empty_db_url)
    again = run_cli("migrate", "--database-url", empty_db_url)
    assert json.loads(first.stdout)["applied"] and json.loads(again.stdout)["applied"] == []


def test_enqueue_one_job(db_url):
    result = run_cli("enqueue", "mail", '{"to": "a@example.com"}', "--delay", "30",
                     "--max-attempts", "2", "--database-url", db_url)
    assert result.returncode == 0, result.stderr
    job_id = json.loads(result.stdout)["id"]
    with connect(db_url) as conn:
        row = conn.execute("SELECT queue, payload, max_attempts, run_at > now() FROM jobs "
                           "WHERE id = %s", (job_id,)).fetchone()
    assert row == ("mail", {"to": "a@example.com"}, 2, True)


@pytest.mark.parametrize("payload", ["{not json", '{"a": NaN}', '"\\u0000"'])
def test_enqueue_refuses_bad_payloads(db_url, payload):
    one_line_error(run_cli("enqueue", "mail", payload, "--database-url", db_url), 2)
    with connect(db_url) as conn:
        assert count(conn) == 0


def test_bulk_enqueue_from_stdin(db_url):
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(500)) + "\n  \n"
    result = run_cli("enqueue", "bulk", "--database-url", db_url, input=lines)
    assert json.loads(result.stdout) == {"enqueued": 500}
    with connect(db_url) as conn:
        assert count(conn, "queue = 'bulk'") == 500


@pytest.mark.parametrize("bad, reason", [
    (b'{"ok": 2}\n{oops\n{"ok": 3}\n', "line 2"),
    (b'{"ok": 2}\n{"ok": 3}\n\xff\xfe\n', "line 3 is not UTF-8"),
    (b'{"ok": 2}\n\n{"ok": 3}\n"\\ud800"\n', "line 4"),
    (b'{"s": "\\u0000"}\n', "line 1"),
])
def test_bulk_enqueue_is_all_or_nothing_and_names_the_bad_line(db_url, bad, reason):
    line = one_line_error(run_cli("enqueue", "bulk", "--database-url", db_url, input=bad), 2)
    assert reason in line and "nothing was enqueued" in line
    with connect(db_url) as conn:
        assert count(conn) == 0


def test_stats_reap_archive_requeue_cancel(db_url):
    with connect(db_url) as conn:
        conn.execute("""
            INSERT INTO jobs (queue, payload, status, attempts, locked_until, created_at)
            VALUES ('a', '{}', 'running', 1, now() - interval '1 minute', now()),
                   ('a', '{}', 'failed', 5, NULL, now()),
                   ('b', '{}', 'queued', 0, NULL, now()),
                   ('b', '{}', 'done', 1, NULL, now() - interval '30 days')""")
    url = ["--database-url", db_url]
    stats = json.loads(run_cli("stats", "--json", *url).stdout)
    by = {(r["queue"], r["status"]): r for r in stats["queues"]}
    assert by[("a", "running")]["expired_leases"] == 1
    assert by[("b", "queued")]["oldest_ready_seconds"] >= 0
    assert "n_dead_tup" in stats["table"]
    table = run_cli("stats", *url).stdout
    assert "expired leases" in table and "dead tuples" in table

    assert json.loads(run_cli("reap", *url).stdout) == {"reaped": 1}
    assert json.loads(run_cli("archive", *url).stdout) == {"archived": 1}
    requeued = json.loads(run_cli("requeue", "--queue", "a", *url).stdout)
    assert requeued["requeued"] == 1
    with connect(db_url) as conn:
        queued = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE status = 'queued' "
                                             "ORDER BY id")]
    cancelled = run_cli("cancel", str(queued[0]), "999999", *url)
    assert json.loads(cancelled.stdout) == {"cancelled": 1, "ids": [queued[0]],
                                            "not_found": [999999]}
    assert cancelled.returncode == 1 and "999999" in cancelled.stderr
    with connect(db_url) as conn:
        assert conn.execute("SELECT status, last_error FROM jobs WHERE id = %s",
                            (queued[0],)).fetchone() == ("failed", "cancelled")
    one_line_error(run_cli("requeue", *url), 2)


def test_drain_prints_the_summary_last_and_logs_to_stderr(db_url):
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 25)")
    result = run_cli("drain", "--database-url", db_url, "--tasks", "noop")
    s = summary_of(result.stdout)
    assert set(s) == {"claimed", "done", "retried", "failed", "lost", "reaped", "archived",
                      "seconds", "stopped", "next_due", "no_task"}
    assert s["done"] == 25 and s["next_due"] is None and s["no_task"] == []
    assert len(result.stdout.strip().splitlines()) == 1  # stdout holds only the summary
    assert "done 25" in result.stderr


def test_the_embedded_default(tmp_path):
    env = clean_env()
    proc = __import__("subprocess").run(
        [__import__("sys").executable, "-m", "drainer", "stats", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "embedded PostgreSQL" in proc.stderr
    assert json.loads(proc.stdout)["queues"] == []
    assert (tmp_path / ".drainer" / "pgdata" / "PG_VERSION").exists()


def error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one stderr line of a refused command, with no traceback."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("drainer: error: "), result.stderr
    assert "Traceback" not in result.stderr and "frozen" not in result.stderr
    return lines[0]


# --- enqueue on a terminal -------------------------------------------------------------

def test_enqueue_on_a_terminal_says_it_reads_json_lines_before_waiting(db_url):
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "enqueue", "typed",
                             "--database-url", db_url], stdin=follower,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    os.close(follower)
    try:
        said = read_until(proc, b"Ctrl-D").decode()  # nothing typed yet: it is waiting
        os.write(leader, b'{"typed": 1}\n')
        os.write(leader, b"\x04")  # Ctrl-D on a line of its own: end of input
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    assert proc.returncode == 0, said + err.decode()
    assert "reading jobs for queue 'typed' from stdin: one JSON document per line" in said
    assert json.loads(out) == {"enqueued": 1}
    with connect(db_url) as conn:
        assert conn.execute("SELECT payload FROM jobs WHERE queue = 'typed'").fetchall() == [
            ({"typed": 1},)]


def test_enqueue_from_a_pipe_says_nothing_about_stdin(db_url):
    result = run_cli("enqueue", "piped", "--database-url", db_url, input='{"a": 1}\n')
    assert json.loads(result.stdout) == {"enqueued": 1}, result.stderr
    assert "Ctrl-D" not in result.stderr and "reading jobs" not in result.stderr


# --- task modules that do not load ------------------------------------------------------

def test_a_task_module_without_a_task_is_named(db_url, tmp_path):
    env = with_modules(tmp_path, settings_only="TIMEOUT = 30\n")
    line = error_line(run_cli("drain", "--database-url", db_url, "--tasks", "settings_only",
                              env=env))
    assert "task module 'settings_only' defines no @task handler" in line
    assert "name the modules" not in line


IMPORT_FAILURES = {
    "a missing dependency": (
        "import json\nimport requests_not_installed_here\n",
        "ModuleNotFoundError: No module named 'requests_not_installed_here' ({path}, line 2)"),
    "a module that raises": (
        "\n\nraise RuntimeError('API_KEY is not set')\n",
        "RuntimeError: API_KEY is not set ({path}, line 3)"),
    "a syntax error": (
        "import os\n\n\nlimit = = 3\n",
        "SyntaxError: invalid syntax ({path}, line 4)"),
}


@pytest.mark.parametrize("case", sorted(IMPORT_FAILURES))
def test_a_task_module_that_fails_to_import_shows_where_and_why_in_one_line(
        db_url, tmp_path, case):
    source, why = IMPORT_FAILURES[case]
    env = with_modules(tmp_path, myapp_tasks=source)
    line = error_line(run_cli("drain", "--database-url", db_url, "--tasks", "myapp_tasks",
                              env=env))
    path = tmp_path / "myapp_tasks.py"
    assert line == ("drainer: error: cannot import task module 'myapp_tasks': "
                    + why.format(path=path))


def test_a_task_module_that_does_not_exist_is_one_line():
    line = error_line(run_cli("drain", "--tasks", "myapp.no_such_tasks"))
    assert line == ("drainer: error: cannot import task module 'myapp.no_such_tasks': "
                    "ModuleNotFoundError: No module named 'myapp'")


@pytest.mark.parametrize("command", ["drain", "work"])
def test_verbose_shows_the_whole_traceback_of_a_failed_import(db_url, tmp_path, command):
    env = with_modules(tmp_path, myapp_tasks="raise RuntimeError('API_KEY is not set')\n")
    result = run_cli(command, "--database-url", db_url, "--tasks", "myapp_tasks", "--verbose",
                     env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert "raise RuntimeError('API_KEY is not set')" in result.stderr  # the source line
    assert result.stderr.strip().splitlines()[-1].startswith(
        "drainer: error: cannot import task module 'myapp_tasks': RuntimeError")


# --- a bad stdin line -------------------------------------------------------------------

@pytest.mark.parametrize("lines, first_bad", [
    (b'{"ok": 1}\n[1, 2]\n{oops\n"text"\n{"also": bad}\n', 3),
    (b'{"ok": 1}\n[1,\n', 2),  # cut short on the last line
    (b'{"ok": 1}\r\n{"ok": 2} {"ok": 3}\r\n', 2),  # two documents on one line
])
def test_a_bad_stdin_line_is_named_once_and_nothing_is_enqueued(db_url, lines, first_bad):
    line = error_line(run_cli("enqueue", "bulk", "--database-url", db_url, input=lines))
    assert re.findall(r"\bline \d+", line) == [f"line {first_bad}"], line
    assert "column" in line and "nothing was enqueued" in line
    with connect(db_url) as conn:
        assert count(conn) == 0


def test_json_lines_that_are_not_objects_are_jobs_too(db_url):
    result = run_cli("enqueue", "bulk", "--database-url", db_url,
                     input='[1, 2]\n"text"\n3\nnull\n{"a": 1}\n')
    assert json.loads(result.stdout) == {"enqueued": 5}, result.stderr
    with connect(db_url) as conn:
        stored = [r[0] for r in conn.execute("SELECT payload FROM jobs ORDER BY id")]
    assert stored == [[1, 2], "text", 3, None, {"a": 1}]


# --- the default command ----------------------------------------------------------------

def test_help_says_drain_is_the_default_command_and_it_is(db_url):
    top = run_cli("--help").stdout
    assert re.search(r"^\s+drain\s+the default command \(run when none is given\)", top, re.M)
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) VALUES ('{}')")
    result = run_cli("--database-url", db_url, "--tasks", "noop")
    assert json.loads(result.stdout.splitlines()[-1])["done"] == 1, result.stderr


# --- the demo's hint --------------------------------------------------------------------

CONSOLE_SCRIPT = """\
import sys
from drainer.commands.cli import main
if __name__ == '__main__':
    sys.exit(main())
"""


def test_the_demo_hint_shows_the_command_as_it_was_run(tmp_path):
    as_module = subprocess.run([sys.executable, "-m", "drainer", "demo"], cwd=tmp_path,
                               env=clean_env(), capture_output=True, text=True, timeout=180)
    assert as_module.returncode == 0, as_module.stderr
    assert f"run `{Path(sys.executable).name} -m drainer demo` again" in as_module.stderr

    script = tmp_path / "bin" / "jobrunner"  # what pip writes for a console script
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT)
    as_script = subprocess.run([sys.executable, str(script), "demo"], cwd=tmp_path,
                               env=clean_env(), capture_output=True, text=True, timeout=180)
    assert as_script.returncode == 0, as_script.stderr
    assert "run `jobrunner demo` again" in as_script.stderr
    assert "-m drainer" not in as_script.stderr


def test_cancel_of_an_id_that_is_no_job_says_so_and_exits_1(db_url):
    """As `show` of it does; the ids that are jobs are cancelled all the same, and a
    job already finished (in jobs or the archive) is no error."""
    url = ("--database-url", db_url)
    with connect(db_url) as conn:
        queued, done, old = (conn.execute(
            "INSERT INTO jobs (payload, status, created_at) "
            "VALUES ('{}', %s, now() - %s::interval) RETURNING id", (status, age)).fetchone()[0]
            for status, age in (("queued", "0 s"), ("done", "0 s"), ("done", "30 days")))
    run_cli("archive", *url)  # the old done job leaves for the archive
    mixed = run_cli("cancel", str(queued), str(done), str(old), "99999", "99998", *url)
    assert mixed.returncode == 1
    assert json.loads(mixed.stdout) == {"cancelled": 1, "ids": [queued],
                                        "not_found": [99998, 99999]}
    error = [line for line in mixed.stderr.splitlines() if line.startswith("drainer: error:")]
    assert error == ["drainer: error: no job 99998, 99999 in jobs or jobs_archive; 1 of 5 "
                     "cancelled"]
    assert f"{done} (done), {old} (done, archived)" in mixed.stderr

    again = run_cli("cancel", str(queued), str(old), *url)  # finished: nothing to do
    assert again.returncode == 0 and f"{queued} (cancelled)" in again.stderr
    unknown = run_cli("cancel", "99999", *url)
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout) == {"cancelled": 0, "ids": [], "not_found": [99999]}
    assert "no job 99999" in unknown.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_parser_built_for_one_command_is_the_whole_ones(command):
    """A run builds the parser of the command it names alone (the others cost a fifth
    of a drain's start); that command's options, defaults and help are the same."""
    def sub(parser) -> cli._Parser:
        [subparsers] = [a for a in parser._actions if hasattr(a, "choices") and a.choices]
        return subparsers.choices[command]

    def arguments(parser: cli._Parser) -> list[tuple]:
        return [(a.option_strings, a.dest, a.default, a.nargs, a.required)
                for a in parser._actions]

    alone, whole = sub(cli.build_parser(command)), sub(cli.build_parser())
    assert alone.format_help() == whole.format_help()
    assert arguments(alone) == arguments(whole)
