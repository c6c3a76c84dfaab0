"""drainer schema version 2."""

from drainer.contrib.django.schema import step

Migration = step(2)
