"""Django migrations that carry drainer's schema: migration N of this app applies
drainer's schema versions up to N through Django's connection (psycopg 3 or 2), in
the migration's transaction, skipping those `drainer migrate` already applied. Each
file of `migrations/` is one line: `Migration = step(N)`."""

from typing import Any

from django.db import migrations, models

from drainer import config
from drainer.storage import schema, sql
from drainer.storage.adapters import DjangoCursors
from drainer.storage.drivers import blocking

# The admin's model of the jobs table (models.py): state only, no table of Django's.
JOB_MODEL = migrations.CreateModel(
    name="Job", fields=[("id", models.BigIntegerField(primary_key=True, serialize=False))],
    options={"db_table": "jobs", "managed": False, "verbose_name": "job"})


def name(version: int) -> str:
    """The migration file's name for a schema version."""
    return f"{version:04d}_schema_{version}"


def step(version: int) -> Any:
    """The Django migration that brings drainer's schema to `version`."""

    def forward(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.alias != config.django_alias():
            return  # drainer's tables live on one database only
        blocking(schema.upgrade(DjangoCursors(connection), version))
        sql.forget(connection.connection)  # enqueue reads the schema's features again

    class Migration(migrations.Migration):  # type: ignore[misc]
        dependencies = [] if version == 1 else [("drainer", name(version - 1))]
        operations = [migrations.RunPython(forward)]  # irreversible: drop by hand
        if version == 1:
            operations.append(JOB_MODEL)

    return Migration
