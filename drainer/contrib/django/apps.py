"""drainer as a Django app: `INSTALLED_APPS = [..., "drainer.contrib.django"]` gives
`manage.py migrate` drainer's tables (its migrations carry drainer's schema, on the
database the DRAINER setting names), `manage.py drainer VERB` (the drainer command
on that database) and a read-only view of the jobs in Django's admin."""

from django.apps import AppConfig


class DrainerConfig(AppConfig):  # type: ignore[misc]
    name = "drainer.contrib.django"
    label = "drainer"
    verbose_name = "drainer jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """The handler for the queues of every drainer backend, those of backends whose
        module could not be imported while the apps were loading included."""
        from .running import register

        register()
