"""drainer schema version 1."""

from drainer.contrib.django.schema import step

Migration = step(1)
