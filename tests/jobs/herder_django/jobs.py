"""A job that uses Django's ORM (each worker has its own in-memory SQLite database)."""

from __future__ import annotations

import os


def orm_roundtrip(text: str) -> dict:
    from django.db import connection

    from herder_django.models import Note

    if Note._meta.db_table not in connection.introspection.table_names():
        with connection.schema_editor() as editor:
            editor.create_model(Note)
    Note.objects.create(text=text)
    return {"count": Note.objects.filter(text=text).count(), "pid": os.getpid()}
