"""drainer schema version 3."""

from drainer.contrib.django.schema import step

Migration = step(3)
