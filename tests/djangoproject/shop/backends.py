"""A task backend of the project's own, in a module that imports its models (as
one may): importable only once Django's apps are loaded."""

from drainer.contrib.django import DrainerBackend
from tests.djangoproject.shop.models import Order


class OrdersBackend(DrainerBackend):
    """Orders' tasks, on drainer."""

    model = Order
