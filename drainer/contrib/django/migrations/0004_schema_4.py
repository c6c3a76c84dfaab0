"""drainer schema version 4."""

from drainer.contrib.django.schema import step

Migration = step(4)
