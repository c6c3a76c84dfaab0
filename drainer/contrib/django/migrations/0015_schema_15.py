"""drainer schema version 15."""

from drainer.contrib.django.schema import step

Migration = step(15)
