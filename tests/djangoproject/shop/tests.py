"""Django's own tests of the test project (`manage.py test tests.djangoproject.shop`),
run by tests/test_django_project.py: drainer's tables in Django's test database,
drainer.testing on Django's connection, and the admin's view of the jobs."""

from unittest.mock import ANY

from django.contrib.auth.models import User
from django.db import connection
from django.test import TestCase

import drainer
from drainer import testing
from drainer.storage.sql import LATEST_VERSION
from tests.djangoproject import tasks
from tests.djangoproject.shop.models import Order

TABLES = {"jobs", "jobs_archive", "drainer_schema", "drainer_schedules", "drainer_starts"}


class TestDatabase(TestCase):
    def test_the_test_database_has_every_table_of_drainer(self):
        self.assertLessEqual(TABLES, set(connection.introspection.table_names()))
        with connection.cursor() as cursor:
            cursor.execute("SELECT max(version) FROM drainer_schema")
            self.assertEqual(cursor.fetchone()[0], LATEST_VERSION)


class TestTesting(TestCase):
    def test_enqueued_and_assert_enqueued_read_djangos_connection(self):
        result = tasks.send.enqueue("ann@example.com")
        (job,) = testing.assert_enqueued(connection, "emails", count=1, payload=ANY)
        self.assertEqual(str(job.id), result.id)
        self.assertEqual(job.payload["args"], ["ann@example.com"])
        self.assertEqual((job.priority, job.key, job.group), (7, None, None))
        self.assertEqual([j.id for j in testing.enqueued(connection)], [job.id])
        with self.assertRaisesRegex(AssertionError, "found 0"):
            testing.assert_enqueued(connection, "emails", payload={"other": 1})

    def test_a_task_whose_query_fails_is_a_failed_attempt_and_the_others_stand(self):
        Order.objects.create(note="taken")
        kept = tasks.remember.enqueue("fresh")
        clash = tasks.remember.enqueue("taken")
        summed = tasks.add.enqueue(2, 3)
        summary = testing.drain_now(connection, in_transaction=True)
        self.assertEqual((summary.done, summary.failed), (2, 1))
        self.assertEqual(tasks.remember.get_result(kept.id).status, "SUCCESSFUL")
        self.assertEqual(tasks.add.get_result(summed.id).return_value, 5)
        failed = tasks.remember.get_result(clash.id)
        self.assertEqual(failed.status, "FAILED")
        self.assertIn("IntegrityError", failed.errors[0].exception_class_path)
        self.assertEqual(sorted(Order.objects.values_list("note", flat=True)),
                         ["fresh", "taken"])

    def test_a_plain_handler_whose_statement_fails_rolls_back_to_its_savepoint(self):
        def insert(job):
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO shop_order (note) VALUES (%s)", [job.payload])

        self.drain_taken_and_new(insert)
        self.assertEqual(Order.objects.count(), 2)

    def test_a_plain_handler_whose_orm_save_fails_leaves_the_test_usable(self):
        def order(job):
            Order.objects.create(note=job.payload)

        self.drain_taken_and_new(order)
        self.assertEqual(sorted(Order.objects.values_list("note", flat=True)), ["new", "taken"])

    def drain_taken_and_new(self, handler):
        """An order "taken", then jobs for "taken" (a unique violation) and "new",
        drained by `handler` in the test's transaction: one done, one failed."""
        Order.objects.create(note="taken")
        for note in ("taken", "new"):
            drainer.enqueue(connection, "notes", note, max_attempts=1)
        summary = testing.drain_now(connection, handlers={"notes": handler},
                                    in_transaction=True)
        self.assertEqual((summary.done, summary.failed), (1, 1))


class TestAdmin(TestCase):
    """The jobs in Django's admin, read-only, every value escaped."""

    def setUp(self):
        self.client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))

    def test_the_jobs_page_shows_the_queues_and_failed_jobs_escaped(self):
        drainer.enqueue(connection, "mail", {"to": "ann"})
        failed = drainer.enqueue(connection, "<b>bad</b>", {"n": 1}, max_attempts=1)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE jobs SET status = 'failed', last_error = %s WHERE id = %s",
                           ["ValueError: <script>alert(1)</script>", failed])
        page = self.client.get("/admin/drainer/job/")
        self.assertEqual(page.status_code, 200)
        text = page.content.decode()
        self.assertIn('<a href="?queue=mail">mail</a></td><td>queued</td>', text)
        self.assertIn("&lt;script&gt;alert(1)&lt;/script&gt;", text)
        self.assertNotIn("<script>alert(1)", text)
        self.assertIn("&lt;b&gt;bad&lt;/b&gt;", text)
        self.assertIn(f'href="/admin/drainer/job/{failed}/change/"', text)
        self.assertNotIn("/admin/drainer/job/add/", text)
        of_queue = self.client.get("/admin/drainer/job/", {"queue": "mail"}).content.decode()
        self.assertIn("No failed jobs.", of_queue)

    def test_one_job_shows_every_column_and_nothing_can_change_it(self):
        job = drainer.enqueue(connection, "mail", {"to": "<ann>"})
        page = self.client.get(f"/admin/drainer/job/{job}/change/")
        self.assertEqual(page.status_code, 200)
        text = page.content.decode()
        self.assertIn('&quot;to&quot;: &quot;&lt;ann&gt;&quot;', text)
        self.assertIn("<th>attempts</th>", text)
        self.assertEqual(self.client.get("/admin/drainer/job/424242/change/").status_code, 404)
        self.assertEqual(self.client.get("/admin/drainer/job/add/").status_code, 403)
        deleted = self.client.post(f"/admin/drainer/job/{job}/delete/", {"post": "yes"})
        self.assertEqual(deleted.status_code, 403)
        self.assertEqual(testing.enqueued(connection, "mail")[0].id, job)

    def test_staff_without_the_view_permission_is_refused(self):
        staff = User.objects.create_user("staff", password="pw", is_staff=True)
        self.client.force_login(staff)
        self.assertEqual(self.client.get("/admin/drainer/job/").status_code, 403)
