"""What a new user meets first at the command line: an enqueue waiting on a terminal,
task modules that do not load, a bad stdin line, the default command, the demo's
hint, the totals `drain` and `work` log, and the row count `stats` shows."""

import json
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from drainer.db import connect
from tests.helpers import clean_env, count, read_until, run_cli, with_modules


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


# --- drain and work totals --------------------------------------------------------------

def totals_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"drainer: (drained: )?done ", line)]


def shape(line: str) -> str:
    """The line's words: numbers and the stop reason left out."""
    return re.sub(r"stopped: \w+", "stopped: R", re.sub(r"\d[\d.,]*", "N", line))


def test_drain_and_work_log_their_totals_in_the_same_words(db_url):
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 3)")
    drained = run_cli("drain", "--database-url", db_url, "--tasks", "noop")
    assert drained.returncode == 0, drained.stderr
    [drain_end] = totals_lines(drained.stderr)

    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 3)")
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "work", "--database-url", db_url,
                             "--tasks", "noop"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env())
    try:
        seen = read_until(proc, b"drained: ")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (seen + err).decode()
    each, work_end = totals_lines((seen + err).decode())

    assert drain_end.startswith("drainer: done 3  retried 0  failed 0  lost 0  ")
    assert drain_end.endswith(", stopped: empty")
    assert work_end.startswith("drainer: done 3  retried 0  failed 0  lost 0  ")
    assert work_end.endswith(", stopped: signal")
    assert shape(work_end) == shape(drain_end)
    assert shape(each) == shape(drain_end).replace("drainer: ", "drainer: drained: ").replace(
        ", stopped: R", "")
    assert json.loads(out.decode().splitlines()[-1])["done"] == 3


# --- stats after a burst ----------------------------------------------------------------

def test_stats_counts_the_rows_and_labels_the_vacuum_statistics_as_an_estimate(db_url):
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(305))
    assert run_cli("enqueue", "burst", "--database-url", db_url, input=lines).returncode == 0
    with connect(db_url) as conn:
        conn.execute("UPDATE jobs SET status = 'done' WHERE id % 5 = 0")
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "jobs table: 305 rows" in text.splitlines()
    [health] = [line for line in text.splitlines() if "dead tuples" in line]
    assert health.startswith("vacuum statistics (PostgreSQL's estimate, updated lazily): ")
    assert re.search(r": \d+ live, \d+ dead tuples; last autovacuum .+, last vacuum ", health)


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
