"""Django migrations that carry drainer's schema: migration N of this app applies
drainer's schema versions up to N through Django's connection (psycopg 3 or 2), in
the migration's transaction, skipping those `drainer migrate` already applied. Each
file of `migrations/` is one line: `Migration = step(N)`."""

from typing import Any

from django.db import migrations

from drainer import config
from drainer.storage import schema, sql
from drainer.storage.adapters import DjangoCursors
from drainer.storage.drivers import blocking


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

    return Migration
