"""drainer schema version 13."""

from drainer.contrib.django.schema import step

Migration = step(13)
