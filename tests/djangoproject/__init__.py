"""A minimal Django project whose Tasks run on drainer (tests/test_django_tasks.py)."""
