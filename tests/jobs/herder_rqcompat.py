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


def delete_itself(how: str) -> str:
    """A job that deletes its own job, the two ways job code does, or cancels it (as another
    client's `job.cancel()` would while it runs): RQ's worker writes its finish all the same
    (the hash comes back, finished, with its result)."""
    from rq.job import Job

    job = get_current_job()
    assert job is not None
    if how == "current":
        job.delete()
    elif how == "cancelled":
        Job.fetch(job.id, connection=job.connection).cancel()
    else:
        Job.fetch(job.id, connection=job.connection).delete()
    return f"deleted ({how})"


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


def snapshot() -> int:
    """Every key RQ has written by the time the job runs, stored as JSON under seen:<job id>:
    {key: [type, TTL, value]}, bytes as latin-1. What a user's code sees mid-job. A TTL, and a
    sorted set's score that is a time, are kept as seconds from now to the nearest ten."""
    import json
    import time

    job = get_current_job()
    assert job is not None
    conn = job.connection
    seen: dict[str, list] = {}
    for key in conn.scan_iter(count=1000):
        if key.startswith(b"seen:"):
            continue
        kind = conn.type(key).decode()
        if kind == "hash":
            value: object = {f.decode("latin-1"): v.decode("latin-1") for f, v in conn.hgetall(key).items()}
        elif kind == "zset":
            value = [
                [m.decode("latin-1"), round(score - time.time(), -1) if score > 1e9 else score]
                for m, score in conn.zrange(key, 0, -1, withscores=True)
            ]
        elif kind == "list":
            value = [m.decode("latin-1") for m in conn.lrange(key, 0, -1)]
        elif kind == "set":
            value = sorted(m.decode("latin-1") for m in conn.smembers(key))
        elif kind == "string":
            value = conn.get(key).decode("latin-1")
        else:
            value = kind
        ttl = conn.ttl(key)
        seen[key.decode("latin-1")] = [kind, ttl if ttl < 0 else round(ttl, -1), value]
    conn.set(f"seen:{job.id}", json.dumps(seen))
    return len(seen)
