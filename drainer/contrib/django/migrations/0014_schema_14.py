"""drainer schema version 14."""

from drainer.contrib.django.schema import step

Migration = step(14)
