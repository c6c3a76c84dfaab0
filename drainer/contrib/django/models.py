"""The jobs table as Django's admin lists it: a model Django never creates, alters or
writes (`managed = False`), only there so the admin has a page for the jobs, which
reads them through drainer's own statements (admin.py)."""

from django.db import models


class Job(models.Model):  # type: ignore[misc]
    id = models.BigIntegerField(primary_key=True)

    class Meta:
        managed = False
        db_table = "jobs"
        verbose_name = "job"
