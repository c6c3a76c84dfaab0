"""drainer as an installed Django app, driven through the test project's manage.py
(tests/djangoproject): `manage.py migrate` gives a fresh database drainer's tables,
`manage.py drainer VERB` runs the drainer command on Django's database with no URL
given, the drain finds that database before DATABASE_URL and never falls back to the
embedded server, and Django's own tests (`manage.py test`) get every table in the
test database, drainer.testing on Django's connection, and the admin's view."""

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from drainer.storage import schema
from drainer.storage.sql import LATEST_VERSION, MIGRATIONS
from tests.helpers import ROOT, clean_env, require_module, run_cli

django = require_module("django", "django")
if django.VERSION < (6,):
    require_module("django_tasks", "django")  # Django 6's Tasks framework, backported

MANAGE = ROOT / "tests" / "djangoproject" / "manage.py"
SETTINGS = "tests.djangoproject.settings"


def env(url: str, **more: str) -> dict[str, str]:
    backport = {"DRAINER_DJANGO_BACKPORT": "1"} if django.VERSION < (6,) else {}
    return clean_env(DJANGO_SETTINGS_MODULE=SETTINGS, DRAINER_DJANGO_DATABASE_URL=url,
                     **backport, **more)


def manage(url: str, *args: str, **more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(MANAGE), *args], text=True,
                          capture_output=True, env=env(url, **more), timeout=240, cwd=ROOT)


def name(version: int) -> str:
    """The Django migration of a schema version (importing drainer.contrib.django needs
    Django's settings, which are the project's processes', not this one's)."""
    return f"{version:04d}_schema_{version}"


def enqueue_add(url: str) -> int:
    """A task enqueued through Django's Tasks API, on Django's database."""
    done = manage(url, "shell", "-c", "from tests.djangoproject import tasks; "
                  "print(tasks.add.enqueue(2, 3).id)")
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def migrated(empty_db_url: str) -> str:
    """A fresh database, as `manage.py migrate` leaves it."""
    done = manage(empty_db_url, "migrate")
    assert done.returncode == 0, done.stderr
    assert "Applying drainer.0001_schema_1... OK" in done.stdout
    return empty_db_url


def test_manage_py_migrate_gives_a_fresh_database_drainers_latest_schema(migrated, db_url):
    with psycopg.connect(migrated) as conn:
        assert schema.version(conn) == LATEST_VERSION
        tables = {t for (t,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"jobs", "jobs_archive", "drainer_schema", "shop_order"} <= tables
    from tests.storage.test_schema import catalog

    drainers = [row for row in catalog(migrated) if not any(
        django in str(v) for v in row for django in ("django_", "auth_", "shop_"))]
    assert drainers == catalog(db_url)  # as `drainer migrate` makes it
    again = manage(migrated, "drainer", "migrate")
    assert again.returncode == 0 and "already" in again.stderr + again.stdout


def test_one_django_migration_per_schema_version():
    folder = ROOT / "drainer" / "contrib" / "django" / "migrations"
    found = sorted(p.stem for p in folder.glob("0*.py"))
    assert found == [name(v) for v in sorted(MIGRATIONS)]
    assert found[-1] == name(LATEST_VERSION)


def test_the_apps_migrations_match_its_models(migrated):
    done = manage(migrated, "makemigrations", "--check", "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr


def test_manage_py_drainer_drains_djangos_database_with_no_url_given(migrated):
    job = enqueue_add(migrated)
    drained = manage(migrated, "drainer", "drain")
    assert drained.returncode == 0, drained.stderr
    assert "embedded" not in drained.stderr
    assert (summary(drained.stdout)["done"], summary(drained.stdout)["stopped"]) == (1, "empty")
    with psycopg.connect(migrated) as conn:
        assert conn.execute("SELECT status, result FROM jobs WHERE id = %s",
                            [job]).fetchone() == ("done", 5)
    jobs = [enqueue_add(migrated) for _ in range(2)]
    members = manage(migrated, "drainer", "drain", "--processes", "2")
    assert members.returncode == 0, members.stderr
    assert summary(members.stdout)["done"] == 2  # the members ran the Django tasks too
    with psycopg.connect(migrated) as conn:
        assert conn.execute("SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = "
                            "'done'", [jobs]).fetchone() == (2,)


def test_the_drain_finds_djangos_database_before_the_usual_variables(migrated, db_url):
    """--database-url first, then Django's database (drainer installed), then
    DRAINER_DATABASE_URL, DATABASE_URL and PG*; never the embedded server while Django
    names a database."""
    job = enqueue_add(migrated)
    unreachable = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    elsewhere = run_cli("drain", "--database-url", db_url, "--tasks",
                        "drainer.contrib.django", env=env(migrated))
    assert elsewhere.returncode == 0 and summary(elsewhere.stdout)["claimed"] == 0
    drained = run_cli("drain", "--tasks", "drainer.contrib.django", env=env(
        migrated, DRAINER_DATABASE_URL=unreachable, DATABASE_URL=unreachable,
        PGHOST="127.0.0.1", PGPORT="1"))
    assert drained.returncode == 0, drained.stderr
    assert "embedded" not in drained.stderr and summary(drained.stdout)["done"] == 1
    with psycopg.connect(migrated) as conn:
        assert conn.execute("SELECT status FROM jobs WHERE id = %s", [job]).fetchone() == (
            "done",)
    # Without drainer among the installed apps, the variables name the database.
    enqueue_add(migrated)
    variables = run_cli("drain", "--tasks", "drainer.contrib.django", env=env(
        migrated, DRAINER_DATABASE_URL=db_url, DRAINER_DJANGO_NO_APP="1"))
    assert variables.returncode == 0, variables.stderr
    assert summary(variables.stdout)["claimed"] == 0  # db_url's jobs table has none


def test_a_drainer_database_django_does_not_have_is_named(migrated):
    done = manage(migrated, "drainer", "stats", DRAINER_DJANGO_ALIAS="jobs")
    assert done.returncode == 2
    assert "drainer's database 'jobs' is not one of Django's DATABASES (default)" in done.stderr


def test_manage_py_drainer_has_the_commands_verbs_help_and_exit_codes(migrated):
    helped = manage(migrated, "drainer", "--help")
    assert helped.returncode == 0 and "usage: drainer" in helped.stdout
    assert "requeue" in helped.stdout and "schedules" in helped.stdout
    listed = manage(migrated, "help")
    assert "\n    drainer\n" in listed.stdout
    stats = manage(migrated, "drainer", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert manage(migrated, "drainer", "show", "424242").returncode == 1
    bad = manage(migrated, "drainer", "drain", "--lease", "nope")
    assert bad.returncode == 2 and "--lease" in bad.stderr


def test_djangos_own_tests_get_every_table_and_drainer_testing_on_its_connection(migrated):
    done = manage(migrated, "test", "tests.djangoproject.shop", "-v", "2")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Ran " in out and "OK" in out
    ran = int(next(line for line in out.splitlines() if line.startswith("Ran "))
              .split()[1])
    tests = Path(ROOT / "tests" / "djangoproject" / "shop" / "tests.py").read_text()
    assert ran == tests.count("    def test_")


@pytest.mark.parametrize("module", [SETTINGS, "tests.djangoproject.no_such_settings"])
def test_django_settings_that_fail_to_import_are_a_configuration_error(module):
    """A settings module that raises (here: the project's, without its variable) or
    that does not exist: exit 2 with one line that names it, no traceback."""
    done = run_cli("stats", env=clean_env(DJANGO_SETTINGS_MODULE=module))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"Django's settings ({module}) cannot be loaded" in done.stderr


def django_url_of(database: dict) -> dict:
    """drainer's connection parameters for a Django database of these settings."""
    code = ("import json, sys, django; from django.conf import settings; "
            "settings.configure(DATABASES={'default': json.loads(sys.argv[1])}); "
            "django.setup(); import psycopg; from drainer import config; "
            "print(json.dumps(psycopg.conninfo.conninfo_to_dict(config.django_url())))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(
        {"ENGINE": "django.db.backends.postgresql", **database})],
        text=True, capture_output=True, env=clean_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_djangos_database_is_the_one_django_connects_to():
    """NAME None is Django's way to the `postgres` database (a service in OPTIONS
    left out); a socket directory and an int port go as given; OPTIONS that are
    Django's own (pool, server_side_binding) stay out."""
    assert django_url_of({"NAME": None, "USER": "app", "OPTIONS": {"service": "shop"}}) == {
        "dbname": "postgres", "user": "app"}
    assert django_url_of({"NAME": "shop", "HOST": "/run/postgresql", "PORT": 5433,
                          "PASSWORD": "p w'd", "OPTIONS": {
                              "server_side_binding": True, "sslmode": "prefer",
                              "options": "-c search_path=shop"}}) == {
        "dbname": "shop", "host": "/run/postgresql", "port": "5433", "password": "p w'd",
        "sslmode": "prefer", "options": "-c search_path=shop"}


def test_manage_py_migrate_on_a_connection_that_prepares_every_statement(empty_db_url):
    """OPTIONS server_side_binding and prepare_threshold 0 (psycopg prepares each
    statement it runs): the migrations, several statements each, are never prepared."""
    done = manage(empty_db_url, "migrate", DRAINER_DJANGO_OPTIONS=json.dumps(
        {"server_side_binding": True, "prepare_threshold": 0}))
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_db_url) as conn:
        assert schema.version(conn) == LATEST_VERSION


def test_manage_py_drainer_takes_djangos_settings_and_pythonpath_options(migrated):
    """--settings and --pythonpath, which manage.py applies for every command, are
    not drainer's options: left out of what drainer parses, wherever they are."""
    done = manage(migrated, "drainer", "--settings", SETTINGS, "stats", "--json",
                  f"--pythonpath={ROOT}")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["queues"] == []


def test_a_task_backend_whose_module_imports_models(migrated):
    """A backend in a module that imports models is imported once Django's apps are
    loaded: manage.py starts, the drainer command runs, and its queues have the
    handler of Django's tasks."""
    more = {"DRAINER_DJANGO_ORDERS_BACKEND": "1"}
    done = manage(migrated, "shell", "-c", "from drainer import tasks; "
                  "print(sorted(tasks.registered()))", **more)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['default', 'emails', 'orders']"
    assert manage(migrated, "drainer", "stats", **more).returncode == 0
    stats = run_cli("stats", env=env(migrated, **more))
    assert stats.returncode == 0, stats.stderr


def test_call_command_drainer_takes_what_manage_py_drainer_takes(migrated):
    """call_command("drainer", ...): options first (a drain, the default command) as
    manage.py takes them; a failure is a CommandError with drainer's exit code."""
    code = ("from django.core.management import call_command, CommandError\n"
            "call_command('drainer', '--max-runtime', '5', '--queue', 'default')\n"
            "try:\n    call_command('drainer', 'show', 424242)\n"
            "except CommandError as exc:\n    print('exit', exc.returncode)\n")
    done = manage(migrated, "shell", "-c", code)
    assert done.returncode == 0, done.stderr
    out = done.stdout.strip().splitlines()
    assert json.loads(out[-2])["stopped"] == "empty" and out[-1] == "exit 1"
