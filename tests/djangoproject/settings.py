"""Settings of the test project: its database is DRAINER_DJANGO_DATABASE_URL's, and its
tasks go to drainer's backend; drainer is one of its installed apps (its tables by
`manage.py migrate`, `manage.py drainer`, the admin's view of the jobs)."""

import json
import os

import psycopg

_info = psycopg.conninfo.conninfo_to_dict(os.environ["DRAINER_DJANGO_DATABASE_URL"])

SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = os.environ.get("DRAINER_DJANGO_USE_TZ", "1") == "1"
TIME_ZONE = os.environ.get("DRAINER_DJANGO_TIME_ZONE", "UTC")
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # Left out by DRAINER_DJANGO_NO_APP: Django's Tasks backend alone, as before.
    *([] if os.environ.get("DRAINER_DJANGO_NO_APP") else ["drainer.contrib.django"]),
    "tests.djangoproject.shop",
    *(["django_tasks"] if os.environ.get("DRAINER_DJANGO_BACKPORT") else []),
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
ROOT_URLCONF = "tests.djangoproject.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DRAINER = ({"DATABASE": os.environ["DRAINER_DJANGO_ALIAS"]}
           if os.environ.get("DRAINER_DJANGO_ALIAS") else {})
DATABASES = {"default": {
    "ENGINE": "django.db.backends.postgresql", "NAME": _info["dbname"],
    "USER": _info.get("user", ""), "PASSWORD": _info.get("password", ""),
    "HOST": _info.get("host", ""), "PORT": _info.get("port", ""),
    "OPTIONS": json.loads(os.environ.get("DRAINER_DJANGO_OPTIONS", "{}")),
}}
TASKS = {"default": {
    "BACKEND": "drainer.contrib.django.DrainerBackend",
    "QUEUES": ["default", "emails"],
}}
if os.environ.get("DRAINER_DJANGO_ORDERS_BACKEND"):
    TASKS["orders"] = {"BACKEND": "tests.djangoproject.shop.backends.OrdersBackend",
                       "QUEUES": ["orders"]}
