"""drainer schema version 10."""

from drainer.contrib.django.schema import step

Migration = step(10)
