"""The command line as a user meets it: real processes, exit codes, messages, help."""

import json
import re

import pytest

from drainer.cli import COMMANDS, build_parser
from drainer.cluster import free_port
from drainer.db import connect
from tests.conftest import clean_env, count, run_cli
from tests.test_processes import summary_of

SECRET = "hunter2-Zq9"


def one_line_error(result, code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("drainer: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_help_documents_every_command_and_option_with_its_variable():
    top = run_cli("--help")
    assert top.returncode == 0 and "DRAINER_" in top.stdout
    for command in COMMANDS:
        assert command in top.stdout
    subparsers = next(a for a in build_parser()._actions if a.choices)
    for command, parser in subparsers.choices.items():
        shared = [a for group in parser._action_groups if group.title in ("database", "drain")
                  for a in group._group_actions]
        assert shared or command == "demo"
        for action in shared:
            assert "[DRAINER_" in action.help, f"{command} {action.option_strings}"
            assert action.option_strings[0] in run_cli(command, "--help").stdout
    drain = run_cli("drain", "--help").stdout
    for flag in ("--database-url", "--queue", "--batch-size", "--lease", "--max-runtime",
                 "--concurrency", "--tasks", "--archive-after", "DRAINER_QUEUES"):
        assert flag in drain


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and re.match(r"drainer \d+\.\d+", result.stdout)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unrecognized arguments"),
    (["--batch-size", "-3"], "at least 1"),
    (["--concurrency", "lots"], "not a whole number"),
    (["--lease", "0"], "above 0"),
    (["enqueue"], "QUEUE"),
])
def test_usage_errors_exit_2(args, message):
    assert message in one_line_error(run_cli(*args), 2)


def test_bad_environment_value_names_the_variable(db_url):
    env = clean_env(DRAINER_BATCH_SIZE="many")
    line = one_line_error(run_cli("drain", "--database-url", db_url, env=env), 2)
    assert "DRAINER_BATCH_SIZE" in line


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
    result = run_cli("drain", "--database-url", url, "--tasks", "noop")
    line = one_line_error(result, 3)
    assert "unavailable" in line and SECRET not in result.stderr + result.stdout


def test_missing_schema_exits_3_and_says_to_migrate(empty_db_url):
    line = one_line_error(run_cli("drain", "--database-url", empty_db_url, "--tasks", "noop"), 3)
    assert "drainer migrate" in line


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
    assert json.loads(cancelled.stdout) == {"cancelled": 1, "ids": [queued[0]]}
    assert "999999" in cancelled.stderr
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
                      "seconds", "stopped", "next_due"}
    assert s["done"] == 25 and s["next_due"] is None
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
