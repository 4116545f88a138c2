"""A user's RQ extras, as `rq worker -w/--exception-handler` would load them: a worker class
and an exception handler that leave traces in Redis, and jobs to run under either runner."""

from __future__ import annotations

from rq import get_current_job
from rq.worker import SimpleWorker


class RecordingWorker(SimpleWorker):
    """Notes, per job, that this class ran it."""

    def execute_job(self, job, queue):  # noqa: ANN001, ANN201 - RQ's signature
        self.connection.rpush(f"ran-by:{job.id}", "RecordingWorker")
        return super().execute_job(job, queue)


def note_failure(job, exc_type, exc_value, traceback) -> bool:  # noqa: ANN001 - RQ's signature
    job.connection.rpush("handled", f"{job.id} {exc_type.__name__}: {exc_value}")
    return True  # and on to RQ's default handler (the FailedJobRegistry)


def add(a: int, b: int) -> dict:
    job = get_current_job()
    assert job is not None
    return {"sum": a + b, "queue": job.origin}


def fail(reason: str) -> None:
    raise ValueError(reason)


def slow(seconds: float) -> str:
    import time

    time.sleep(seconds)
    return "slept"


# RQ's callbacks, each leaving a trace: callbacks:<job id> -> what happened.
def noted_success(job, connection, result) -> None:  # noqa: ANN001 - RQ's signature
    connection.rpush(f"callbacks:{job.id}", f"success {result}")


def noted_failure(job, connection, exc_type, exc_value, traceback) -> None:  # noqa: ANN001
    connection.rpush(f"callbacks:{job.id}", f"failure {exc_type.__name__}")


def noted_stop(job, connection) -> None:  # noqa: ANN001
    connection.rpush(f"callbacks:{job.id}", "stopped")
