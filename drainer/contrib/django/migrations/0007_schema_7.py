"""drainer schema version 7."""

from drainer.contrib.django.schema import step

Migration = step(7)
