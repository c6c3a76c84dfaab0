"""A read-only view of the jobs in Django's admin: the queues and their failed jobs
(what `drainer stats` and `drainer failed` show) and one job (`drainer show`), read
through the same statements. Nothing can be added, changed or deleted here; the
drainer command (`manage.py drainer requeue`, `cancel`) acts on jobs."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.template.response import TemplateResponse

from drainer import config
from drainer.commands.failed import failed
from drainer.commands.show import column_text, job, lease_note
from drainer.commands.stats import stats
from drainer.errors import DrainerError

from .models import Job

FAILED_SHOWN = 50


@contextmanager
def _reading() -> Iterator[psycopg.Connection]:
    """drainer's database as the request sees it: Django's own connection on psycopg
    3, else (psycopg 2) a connection of the request's own, closed after it."""
    from django.db import connections

    django = connections[config.django_alias()]
    django.ensure_connection()
    if isinstance(django.connection, psycopg.Connection):
        yield django.connection
    else:
        with psycopg.connect(config.django_url(), autocommit=True) as conn:
            yield conn


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):  # type: ignore[misc]
    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def _page(self, request: Any, template: str, title: str, **context: Any) -> Any:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(request, f"drainer/admin/{template}", {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": title, **context})

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        """The queues by status and the newest failed jobs with their errors."""
        queue = request.GET.get("queue") or None
        with _reading() as conn:
            found, failures = stats(conn), failed(conn, queue_name=queue, limit=FAILED_SHOWN)
        return self._page(request, "jobs.html", "Jobs", stats=found, failed=failures,
                          queue=queue)

    def change_view(self, request: Any, object_id: str, form_url: str = "",
                    extra_context: Any = None) -> Any:
        """One job, every column, as `drainer show` prints it."""
        try:
            with _reading() as conn:
                shown = job(conn, int(object_id))
        except (ValueError, DrainerError):
            raise Http404(f"no job {object_id}") from None
        return self._page(request, "job.html", f"Job {object_id}", archived=shown.archived,
                          columns=[(k, column_text(k, v)) for k, v in shown.row.items()],
                          lease=lease_note(shown.row.get("status"), shown.lease_left))
