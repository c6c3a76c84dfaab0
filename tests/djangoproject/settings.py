"""Settings of the test project: its database is DRAINER_DJANGO_DATABASE_URL's, and its
tasks go to drainer's backend."""

import os

import psycopg

_info = psycopg.conninfo.conninfo_to_dict(os.environ["DRAINER_DJANGO_DATABASE_URL"])

SECRET_KEY = "tests-only"
USE_TZ = os.environ.get("DRAINER_DJANGO_USE_TZ", "1") == "1"
TIME_ZONE = os.environ.get("DRAINER_DJANGO_TIME_ZONE", "UTC")
INSTALLED_APPS = ["django_tasks"] if os.environ.get("DRAINER_DJANGO_BACKPORT") else []
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": _info["dbname"],
    "USER": _info.get("user", ""), "PASSWORD": _info.get("password", ""),
    "HOST": _info.get("host", ""), "PORT": _info.get("port", ""),
}}
TASKS = {"default": {
    "BACKEND": "drainer.contrib.django.DrainerBackend",
    "QUEUES": ["default", "emails"],
}}
