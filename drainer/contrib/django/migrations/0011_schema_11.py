"""drainer schema version 11."""

from drainer.contrib.django.schema import step

Migration = step(11)
