"""Django's Tasks framework on drainer: `DrainerBackend`, a task backend that writes
each task as one drainer job through Django's own connection, and the drainer tasks
that run them.

Settings (Django 6's `django.tasks`, or the `django-tasks` backport on older Django)::

    TASKS = {"default": {
        "BACKEND": "drainer.contrib.django.DrainerBackend",
        "QUEUES": ["default", "emails"],   # the drainer queues of these tasks
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 1},
    }}

A drain runs them with the same settings::

    DJANGO_SETTINGS_MODULE=mysite.settings python -m drainer drain --tasks drainer.contrib.django

Importing this module registers one drainer task (keep_result=True) per queue listed
by the drainer backends of `TASKS`; its handler imports the Django task named in the
job, calls `django.setup()` once, runs the task's function (an `async def` on
drainer's event loop) and closes Django's stale connections before and after, as
Django's request cycle does. A failure's exception class and traceback are kept in
the job's meta for `get_result()`.
"""

from .backend import DrainerBackend
from .running import queues, register, run

__all__ = ["DrainerBackend", "queues", "register", "run"]

register()
