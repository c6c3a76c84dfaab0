"""drainer schema version 8."""

from drainer.contrib.django.schema import step

Migration = step(8)
