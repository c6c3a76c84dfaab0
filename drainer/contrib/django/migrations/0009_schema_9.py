"""drainer schema version 9."""

from drainer.contrib.django.schema import step

Migration = step(9)
