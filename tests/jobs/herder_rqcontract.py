"""Jobs and hooks for tests/test_abandoned.py: a job whose worker dies on every attempt, and
the failure callback and exception handler that record each call in Redis."""

from __future__ import annotations

import json
import os
import time

from rq import get_current_job


def die_every_time() -> None:
    """Its worker dies at once, every attempt (as a segfaulting C extension or an OOM kill)."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush(f"contract:attempt:{job.id}", repr(time.time()))
    os._exit(3)


def _record(kind: str, job, exc_type, exc_value) -> None:  # noqa: ANN001 - RQ's hook arguments
    entry = {"type": exc_type.__name__, "message": str(exc_value), "pid": os.getpid()}
    entry["bases"] = [c.__name__ for c in exc_type.__mro__]
    job.connection.rpush(f"contract:{kind}:{job.id}", json.dumps(entry))


def on_failure(job, connection, exc_type, exc_value, tb) -> None:  # noqa: ANN001
    _record("callback", job, exc_type, exc_value)


def handler(job, exc_type, exc_value, tb) -> bool:  # noqa: ANN001
    _record("handler", job, exc_type, exc_value)
    return True
