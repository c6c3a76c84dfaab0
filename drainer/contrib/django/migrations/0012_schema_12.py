"""drainer schema version 12."""

from drainer.contrib.django.schema import step

Migration = step(12)
