"""Django's own tests of the test project (`manage.py test tests.djangoproject.shop`),
run by tests/test_django_project.py: drainer's tables in Django's test database,
drainer.testing on Django's connection, and the admin's view of the jobs."""

from django.db import connection
from django.test import TestCase

from drainer.storage.sql import LATEST_VERSION

TABLES = {"jobs", "jobs_archive", "drainer_schema", "drainer_schedules", "drainer_starts"}


class TestDatabase(TestCase):
    def test_the_test_database_has_every_table_of_drainer(self):
        self.assertLessEqual(TABLES, set(connection.introspection.table_names()))
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(version) FROM drainer_schema")
            self.assertEqual(cursor.fetchone()[0], LATEST_VERSION)
