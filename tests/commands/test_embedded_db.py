"""The embedded default under ./.drainer/: `drainer db url|start|stop`, and no server
leaked by a drainer that dies without cleaning up (kill -9).

Every test runs real `python -m drainer` processes in a tmp working directory with no
DATABASE_URL, and counts the PostgreSQL servers whose data directory is in it: a
postmaster keeps its command line (`postgres -D <dir>/.drainer/pgdata ...`), its
children rename themselves, and a dead one that was not reaped has none.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest

import drainer
from tests.helpers import ROOT, clean_env, run_cli, summary_of, wait_until

ELSEWHERE = "postgresql://nobody@127.0.0.1:1/elsewhere"  # a DATABASE_URL `db` must ignore


def postmasters(directory: Path) -> list[int]:
    """The pids of the PostgreSQL servers whose data directory is under `directory`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue  # gone meanwhile
        if args[:1] and args[0].endswith(b"postgres") and any(
                str(directory).encode() in arg for arg in args):
            found.append(int(entry.name))
    return found


def gone(*pids: int) -> bool:
    """Whether every one of the processes has exited."""
    return all(map(_gone, pids))


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited; its parent (the init process) has yet to reap it


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A working directory for ./.drainer/; whatever server a failed test leaves in it
    is stopped (fast shutdown, then SIGKILL). Not under pytest's tmp_path: run as
    root, the server runs as another user, who must be able to reach its data
    directory, and every pytest session that starts makes /tmp/pytest-of-root
    private again, under the feet of a server starting in another session."""
    path = Path(tempfile.mkdtemp(prefix="drainer-embedded-"))
    yield path
    _stop_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


def _stop_leftovers(path: Path) -> None:
    for sig in (signal.SIGINT, signal.SIGKILL):
        left = postmasters(path)
        for pid in left:
            os.kill(pid, sig)
        try:
            wait_until(partial(gone, *left), timeout=10)
            return
        except AssertionError:
            continue


def cli(workdir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    result = run_cli(*args, cwd=workdir, env=clean_env(**env))
    assert result.returncode == 0, (args, result.stderr)
    return result


def flat(text: str) -> str:
    return " ".join(text.split())


def test_db_help_says_it_acts_on_the_embedded_server_whatever_database_url_says():
    for args in (["db"], ["db", "url"], ["db", "start"], ["db", "stop"]):
        text = flat(run_cli(*args, "--help").stdout)
        assert "./.drainer/" in text and "DATABASE_URL" in text, args
    refused = run_cli("db", "url", "--database-url", ELSEWHERE)  # no such option to mislead
    assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr
    assert "$(drainer db url)" in flat(run_cli("db", "url", "--help").stdout)
    # The app reads DATABASE_URL, as the tutorial's does; `eval` sets it.
    described = run_cli("db", "--help").stdout
    assert 'eval "$(drainer db start)"' in described and "reads DATABASE_URL" in described
    for action in ("start", "env"):
        assert f'eval "$(drainer db {action})"' in run_cli("db", action, "--help").stdout
    assert "db" in run_cli("--help").stdout
    missing = run_cli("db")
    assert missing.returncode == 2 and "ACTION" in missing.stderr


def test_db_url_start_and_stop_serve_an_app(workdir):
    first = cli(workdir, "db", "url", DATABASE_URL=ELSEWHERE)
    url = first.stdout.strip()
    assert first.stdout.count("\n") == 1 and url.startswith("postgresql://")
    assert "DATABASE_URL" in first.stderr  # the note: `db` does not act on it
    assert len(postmasters(workdir)) == 1  # left running for the app
    with psycopg.connect(url) as conn:  # migrated: the app can enqueue at once
        where = conn.execute("SHOW data_directory").fetchone()[0]
        drainer.enqueue(conn, "default", {"from": "app"})
    assert Path(where) == workdir / ".drainer" / "pgdata"

    again = cli(workdir, "db", "start", DATABASE_URL=ELSEWHERE)
    assert again.stdout == f"export DATABASE_URL={shlex.quote(url)}\n"
    assert "already running" in again.stderr
    drained = summary_of(cli(workdir, "drain", "--tasks", "noop").stdout)
    assert drained["done"] == 1
    assert len(postmasters(workdir)) == 1  # a drain leaves a kept server running

    same = cli(workdir, "db", "url", DATABASE_URL=url)  # the app's own variable, exported
    assert same.stdout.strip() == url and "note" not in same.stderr

    stopped = cli(workdir, "db", "stop", DATABASE_URL=ELSEWHERE)
    assert "stopped" in stopped.stderr and postmasters(workdir) == []
    assert "not running" in cli(workdir, "db", "stop").stderr


def in_bash(workdir: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    """`script` run by bash in `workdir`, where `drainer` and `python` are this
    interpreter's (as in a virtualenv a user has activated)."""
    shims = 'drainer() { "$PY" -m drainer "$@"; }; python() { "$PY" "$@"; }; '
    result = subprocess.run(["bash", "-c", shims + script], cwd=workdir, capture_output=True,
                            text=True, env=clean_env(PY=sys.executable, **env), timeout=120)
    assert result.returncode == 0, (script, result.stdout, result.stderr)
    return result


def test_db_start_and_db_env_print_the_lines_a_shells_eval_runs(workdir):
    script = ('eval "$(drainer db start)" && drainer enqueue default "{}" >/dev/null && '
              'printf "%s\\n%s\\n" "$DATABASE_URL" "${DRAINER_DATABASE_URL-unset}"')
    url, drainer_url = in_bash(workdir, script, DATABASE_URL=ELSEWHERE,
                               DRAINER_DATABASE_URL=ELSEWHERE).stdout.splitlines()
    assert url == cli(workdir, "db", "url").stdout.strip()  # the embedded server's
    assert drainer_url == "unset"  # drainer commands would have preferred it
    env = cli(workdir, "db", "env")
    assert shlex.split(env.stdout) == ["export", f"DATABASE_URL={url}"]
    assert "unset" in cli(workdir, "db", "env", DRAINER_DATABASE_URL=ELSEWHERE).stdout
    # The enqueue after eval went to the embedded server, not to ELSEWHERE.
    assert summary_of(cli(workdir, "drain", "--tasks", "noop").stdout)["done"] == 1
    cli(workdir, "db", "stop")


def documented_evals() -> set[str]:
    """Every `eval "$(...)"` the README and the examples show."""
    pages = [ROOT / "README.md", *(ROOT / "examples").rglob("*.md")]
    return {found for page in pages
            for found in re.findall(r'eval "\$\([^)]*\)"', page.read_text())}


def test_every_documented_eval_sets_database_url_to_the_embedded_servers(workdir):
    evals = documented_evals()
    assert {'eval "$(drainer db start)"', 'eval "$(python -m drainer db start)"',
            'eval "$(drainer db env)"'} <= evals
    for line in sorted(evals):
        shown = in_bash(workdir, f'{line} && printf "%s" "$DATABASE_URL"').stdout
        assert shown == cli(workdir, "db", "url").stdout.strip(), line
    cli(workdir, "db", "stop")


def test_a_server_in_use_is_stopped_by_its_last_user_only(workdir):
    release = workdir / "release"
    cli(workdir, "enqueue", "default", json.dumps({"touch": str(workdir / "started"),
                                                   "wait_for": str(release)}))
    assert postmasters(workdir) == []  # a command stops the server it started
    drain = subprocess.Popen([sys.executable, "-m", "drainer", "drain", "--tasks", "behave"],
                             cwd=workdir, env=clean_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    wait_until((workdir / "started").exists)
    cli(workdir, "stats", "--json")  # joins the drain's server, leaves it to the drain
    assert len(postmasters(workdir)) == 1
    release.touch()
    out, err = drain.communicate(timeout=60)
    assert drain.returncode == 0 and summary_of(out)["done"] == 1, err
    assert postmasters(workdir) == []


def leave_a_server_behind(workdir: Path) -> int:
    """A drain on the embedded default, killed with SIGKILL mid-job: its server runs on
    (a postmaster is a session of its own). Returns the server's pid."""
    touch = workdir / "started"
    cli(workdir, "enqueue", "default", json.dumps({"touch": str(touch), "sleep": 60}))
    drain = subprocess.Popen([sys.executable, "-m", "drainer", "drain", "--tasks", "behave"],
                             cwd=workdir, env=clean_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    wait_until(touch.exists)
    drain.send_signal(signal.SIGKILL)
    drain.wait(timeout=10)
    [server] = postmasters(workdir)
    return server


def test_a_drain_killed_with_kill_9_leaks_no_server(workdir):
    leave_a_server_behind(workdir)
    for args in (["stats", "--json"], ["drain", "--tasks", "noop"], ["enqueue", "other", "{}"]):
        cli(workdir, *args)
        assert postmasters(workdir) == [], args  # reused, then stopped by its last user


def test_a_stale_postmaster_pid_naming_another_process_is_not_trusted(workdir):
    """The server died too, and its pid now belongs to another process (a reboot, a
    container restart): the pid in postmaster.pid is alive but is not PostgreSQL."""
    server = leave_a_server_behind(workdir)
    os.kill(server, signal.SIGKILL)
    wait_until(partial(gone, server))
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        pid_file = workdir / ".drainer" / "pgdata" / "postmaster.pid"
        lines = pid_file.read_text().splitlines(keepends=True)
        pid_file.write_text("".join([f"{stand_in.pid}\n", *lines[1:]]))

        assert "not running" in cli(workdir, "db", "stop").stderr
        for args in (["stats", "--json"], ["drain", "--tasks", "noop"]):
            cli(workdir, *args)
            assert postmasters(workdir) == [], args
        assert stand_in.poll() is None  # never signalled
    finally:
        stand_in.kill()
        stand_in.wait()


def test_db_survives_a_database_url_that_is_not_utf8(tmp_path):
    """`db` reads DATABASE_URL only to decide on its note: a URL libpq cannot read
    (a byte that is not UTF-8) must not end `drainer db stop` in an unexpected error."""
    proc = run_cli("db", "stop", cwd=tmp_path,
                   env=clean_env(DATABASE_URL="postgresql://u:p\udcff@db.example/app"))
    assert "unexpected error" not in proc.stderr, proc.stderr
    assert proc.returncode != 1
