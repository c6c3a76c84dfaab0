from django.db import models


class Order(models.Model):
    note = models.TextField(unique=True)
