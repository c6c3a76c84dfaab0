"""drainer schema version 5."""

from drainer.contrib.django.schema import step

Migration = step(5)
