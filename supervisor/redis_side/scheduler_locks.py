"""RQ's scheduler locks, seen from the master: who holds them, and freeing a dead holder's.

A thread, so the reconcile loop never waits on Redis. It
- releases the locks of this host's scheduler process the moment the loop reaps it (RQ's
  owner-checked Lua script: only what that process still held, never another's), so its
  replacement or another host's standby takes over within a tick instead of a lock TTL;
- reads, every INTERVAL, which scheduler holds each queue's lock (rq:scheduler-lock:<queue>)
  and the cron lock (herder:cron-lock), and that scheduler's record (rq:scheduler:<name>:
  host, pid), for `herder status`. A herder scheduler's name is new with each process, so its
  record is read once, when the name first holds a lock: a reading is then one round trip.
  In a master the reading rides along with the load reader's (load_reader.Rider, once a scale
  interval): one wake-up and one round trip for both; this thread then wakes only to release.

A release waits and retries while Redis is unreachable; it is never dropped for that (the
lock's TTL is the backstop if the master exits first).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from redis import Redis
from redis.client import Pipeline
from rq.scheduler import SCHEDULER_KEY_TEMPLATE, RQScheduler
from rq.scripts import RELEASE_LOCK_SCRIPT

from herder.common.rq_names import CRON_LOCK_KEY
from herder.supervisor.redis_side.load_reader import LoadReader

log = logging.getLogger("herder")

INTERVAL = 1.0
RETRY = 0.5


@dataclass(frozen=True)
class Holder:
    name: str  # the RQ scheduler's name (the lock's value)
    host_id: str  # the herder host it runs on; "" if it is not herder's
    hostname: str
    pid: int | None


@dataclass(frozen=True)
class LockReading:
    holders: dict[str, Holder | None]  # queue -> who holds its lock (None: nobody)
    at: float  # monotonic
    cron: Holder | None = None  # who holds the cron lock (herder.common.rq_names.CRON_LOCK_KEY)


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw is not None else ""


class SchedulerLocks:
    def __init__(self, connection: Redis, queues: list[str]) -> None:
        self.connection = connection
        self._release = connection.register_script(RELEASE_LOCK_SCRIPT)
        self._cond = threading.Condition()
        self._queues = list(queues)
        self._pending: list[tuple[str, tuple[str, ...]]] = []  # (scheduler name, its queues)
        self._reading: LockReading | None = None
        self._holders: dict[str, Holder] = {}  # a holding scheduler's name -> its record, read once
        self._riding: list[str] | None = None  # the queues of the reading riding along (ride())
        self.carried = False  # read with the load reader's readings (ride_with()), not by this thread
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="scheduler-locks", daemon=True)

    # ---- called by the reconcile loop (never blocks on Redis) ---------------------------

    def start(self) -> None:
        self._thread.start()

    def set_queues(self, queues: list[str]) -> None:
        with self._cond:
            self._queues = list(queues)

    def release(self, name: str, queues: list[str]) -> None:
        """Free the locks `name` still holds on `queues`, and delete its record."""
        with self._cond:
            self._pending.append((name, tuple(queues)))
            self._cond.notify()

    def reading(self) -> LockReading | None:
        with self._cond:
            return self._reading

    def drain(self, timeout: float) -> int:
        """Stop after the pending releases (up to `timeout` s); how many were left undone."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._stop = True
            self._cond.notify()
            while self._pending and self._thread.is_alive() and time.monotonic() < deadline:
                self._cond.wait(0.05)
            return len(self._pending)

    # ---- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_read = 0.0
        warned: set[str] = set()
        while True:
            with self._cond:
                if self._stop and not self._pending:
                    return
                pending = list(self._pending)
            failed = False
            for name, queues in pending:  # oldest first
                try:
                    self._free(name, queues)
                    with self._cond:
                        self._pending.remove((name, queues))
                        self._cond.notify_all()
                except Exception as exc:  # an outage: try again, never drop a release
                    if name not in warned:
                        log.warning("cannot release scheduler %s's locks yet (%s); retrying", name, exc)
                        warned.add(name)
                    failed = True
                    break
            now = time.monotonic()
            if now >= next_read and not self._stop and not self.carried:
                next_read = now + INTERVAL
                try:
                    reading = self._read()
                except Exception:  # shown as unknown in status; the next read may succeed
                    reading = None
                with self._cond:
                    self._reading = reading or self._reading
            with self._cond:
                if not self._pending or failed:
                    wait = None if self.carried else max(0.0, next_read - time.monotonic())
                    self._cond.wait(RETRY if failed else wait)

    def _free(self, name: str, queues: tuple[str, ...]) -> None:
        pipe = self.connection.pipeline(transaction=False)
        for q in queues:
            self._release(keys=[RQScheduler.get_locking_key(q)], args=[name], client=pipe)
        self._release(keys=[CRON_LOCK_KEY], args=[name], client=pipe)  # owner-checked: only its own
        pipe.delete(SCHEDULER_KEY_TEMPLATE % name)
        replies = pipe.execute()
        freed = [q for q, n in zip(queues, replies[: len(queues)], strict=True) if n]
        freed += ["cron"] if replies[len(queues)] else []
        if freed:
            log.info("released scheduler %s's lock of %s", name, ", ".join(freed))

    # ---- the reading, riding along with the load reader's (load_reader.Rider) ----------------

    def ride_with(self, reader: LoadReader) -> None:
        """Be read with `reader`'s readings from now on, not by this thread (before start())."""
        self.carried = True
        reader.carry(self)

    def ride(self, pipe: Pipeline) -> None:
        with self._cond:
            self._riding = list(self._queues)
        pipe.mget(self._keys(self._riding))

    def arrived(self, reply: list[bytes | None]) -> None:
        queues = self._riding or []
        try:
            reading = self._holders_of(queues, reply)
        except Exception:  # a holder's record unread: the next reading may succeed
            return
        with self._cond:
            self._reading = reading

    def _keys(self, queues: list[str]) -> list[str]:
        return [RQScheduler.get_locking_key(q) for q in queues] + [CRON_LOCK_KEY]

    def _read(self) -> LockReading:
        with self._cond:
            queues = list(self._queues)
        return self._holders_of(queues, self.connection.mget(self._keys(queues)))

    def _holders_of(self, queues: list[str], values: list[bytes | None]) -> LockReading:
        """Who holds each lock, from the locks' values (an MGET of _keys(queues)); a new holder's
        record read in one more round trip."""
        *names, cron_name = [_text(n) or None for n in values]
        holding = {n for n in [*names, cron_name] if n}
        records = {n: h for n, h in self._holders.items() if n in holding}
        new = sorted(holding - records.keys())
        if new:
            pipe = self.connection.pipeline(transaction=False)
            for n in new:
                pipe.hmget(SCHEDULER_KEY_TEMPLATE % n, ["herder_host", "hostname", "pid"])
            for n, record in zip(new, pipe.execute(), strict=True):
                host, hostname, pid = (_text(x) for x in record)
                records[n] = Holder(n, host, hostname, int(pid) if pid.isdigit() else None)
        # Kept for the next reading: a herder scheduler's record, once written (a lock may show
        # before it; herder_host comes in the same write as the pid). Another's is read each
        # time: RQ's own scheduler may come back under the same name.
        self._holders = {n: h for n, h in records.items() if h.host_id}

        def holder(n: str | None) -> Holder | None:
            return None if n is None else records[n]

        holders = {q: holder(n) for q, n in zip(queues, names, strict=True)}
        return LockReading(holders, time.monotonic(), holder(cron_name))
