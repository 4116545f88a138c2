from django.db import models


class Note(models.Model):
    text = models.CharField(max_length=100)

    class Meta:
        app_label = "herder_django"
