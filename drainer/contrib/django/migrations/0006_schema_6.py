"""drainer schema version 6."""

from drainer.contrib.django.schema import step

Migration = step(6)
