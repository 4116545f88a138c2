"""Redis work that the reconcile loop must never wait on.

Requeueing a dead worker's job, or unregistering a dead RQ worker, talks to Redis.
Redis can hang (overloaded, paused, a network partition) for a socket timeout at a
time; the loop cannot, or it stops heartbeating and the watchdog kills a healthy
master. So the loop only submits; this one thread does the Redis calls, in order,
and keeps a task until it succeeds: a job is never dropped because Redis was away.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from redis import Redis

from herder.supervisor.redis_side.requeue import Outcome, forget_worker, requeue_or_fail

log = logging.getLogger("herder")

RETRY_INTERVAL = 1.0


@dataclass(frozen=True)
class Task:
    kind: str  # "requeue" or "forget"
    subject: str  # job id, or RQ worker name
    reason: str = ""


class Requeuer:
    def __init__(self, connection: Redis, max_requeues: int) -> None:
        self.connection = connection
        self.max_requeues = max_requeues
        self._tasks: deque[Task] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self.requeued = 0
        self.failed = 0
        self._outage_since: float | None = None
        self._thread = threading.Thread(target=self._run, name="requeuer", daemon=True)
        self._thread.start()

    def set_max_requeues(self, limit: int) -> None:
        """A reload's limit, for the requeues still to come."""
        self.max_requeues = limit

    def requeue(self, job_id: str, reason: str) -> None:
        self._submit(Task("requeue", job_id, reason))

    def forget(self, worker_name: str) -> None:
        self._submit(Task("forget", worker_name))

    def count_kill(self, key: str, window: float) -> None:
        """Add one kill to the cluster-wide budget counter (see budget.py)."""
        self._submit(Task("count_kill", key, str(window)))

    def _submit(self, task: Task) -> None:
        with self._cond:
            self._tasks.append(task)
            self._cond.notify()

    def pending(self) -> int:
        """Requeues not yet done (a forget does not count: RQ's TTL cleans those anyway)."""
        with self._cond:
            return sum(t.kind == "requeue" for t in self._tasks) + (1 if self._busy else 0)

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` for the requeues to be done; return how many are left."""
        deadline = time.monotonic() + timeout
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.pending()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._tasks:
                    self._cond.wait()
                task = self._tasks[0]
                self._busy = task.kind == "requeue"
            try:
                self._do(task)
            except Exception as exc:  # Redis unreachable or failing: keep the task, retry
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    log.error(
                        "Redis error while handling %s %s (%s: %s); retrying every %g s until it answers",
                        task.kind,
                        task.subject,
                        exc.__class__.__name__,
                        exc,
                        RETRY_INTERVAL,
                    )
                with self._cond:
                    self._busy = False
                time.sleep(RETRY_INTERVAL)
                continue
            if self._outage_since is not None:
                log.warning(
                    "Redis answers again after %.1f s; catching up", time.monotonic() - self._outage_since
                )
                self._outage_since = None
            with self._cond:
                self._tasks.popleft()
                self._busy = False

    def _do(self, task: Task) -> None:
        if task.kind == "forget":
            forget_worker(self.connection, task.subject)
            return
        if task.kind == "count_kill":
            with self.connection.pipeline() as pipe:
                pipe.incr(task.subject)
                pipe.expire(task.subject, int(float(task.reason) * 2) + 1)
                pipe.execute()
            return
        outcome: Outcome = requeue_or_fail(self.connection, task.subject, task.reason, self.max_requeues)
        if outcome.action == "requeued":
            self.requeued += 1
            log.warning("job %s: requeued at the front of its queue (%s)", task.subject, outcome.detail)
        elif outcome.action == "failed":
            self.failed += 1
            log.error("job %s: moved to the failed job registry: %s", task.subject, outcome.detail)
        else:
            log.info("job %s: not requeued (%s)", task.subject, outcome.detail)
