"""herder's scheduler process: python -P -m herder.worker.scheduler, started by the master.

RQ's own scheduler (rq.scheduler.RQScheduler) moves the jobs whose time has come
(enqueue_at, enqueue_in, the intervals of Retry) from each queue's ScheduledJobRegistry onto
the queue. One lock per queue (rq:scheduler-lock:<queue>, taken with RQ's own Lua script)
makes it safe to run any number of them: whoever holds a queue's lock schedules it, so each
queue is scheduled in exactly one place, across hosts and next to plain `rq worker
--with-scheduler` processes.

The master runs one of these per host (herder.supervisor.children.scheduler) and watches it like a
worker, through the worker protocol's lines: `ready` once Redis answers, `idle` from the main
loop (a stuck loop goes silent and is killed), `stop` as it leaves; `stop` or EOF on stdin
asks it to release its locks and exit, SIGTERM ends it at once. Two differences from RQ's
loop, both for a fast hand-over: every tick it tries for each lock it lacks (RQ retries every
2 minutes), so a standby takes over within a tick of a lock coming free; and its locks live
`lock_ttl` seconds, not 61, so a whole host that died stops holding them sooner.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import UTC, datetime

from redis import Redis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.cron import CronScheduler
from rq.scheduler import RQScheduler
from rq.scripts import ACQUIRE_OR_REFRESH_LOCK_SCRIPT, RELEASE_LOCK_SCRIPT
from rq.utils import now

from herder.common import rq_seam
from herder.common.config import Config
from herder.common.redis_connect import connect
from herder.common.rq_names import CRON_LOCK_KEY, ENV_SCHEDULER_NAME
from herder.worker.channel import Channel

INTERVAL = 1.0  # seconds between ticks: a scheduled job is enqueued at most this late (RQ's default)


def lock_ttl(cfg: Config) -> int:
    """Seconds a lock outlives its last renewal. Longer than the master lets the process stay
    silent before it kills it (and then releases its locks at once), so a live scheduler's
    lock never lapses under it; short enough that a host that died whole, whose master
    cannot release anything, frees its queues within seconds rather than RQ's minute."""
    return int(cfg.heartbeat_timeout + cfg.kill_timeout) + 5


def say(text: str) -> None:
    print(f"herder scheduler: {text}", file=sys.stderr, flush=True)


class HerderScheduler(RQScheduler):
    """RQ's scheduler for the queues (with `scheduler` on), and RQ's cron (with `cron` set)."""

    def __init__(self, cfg: Config, connection: Redis, name: str) -> None:
        super().__init__(
            cfg.queues if cfg.scheduler else [],
            connection=connection,
            interval=INTERVAL,
            logging_level=cfg.log_level.upper(),
            log_format="%(levelname)s %(message)s",
            name=name,
        )
        self.host_id = cfg.host_id
        self.lock_ttl = lock_ttl(cfg)
        self.pid = os.getpid()
        self._lock_script = self.connection.register_script(ACQUIRE_OR_REFRESH_LOCK_SCRIPT)
        self._ticked = False
        self.cron: CronScheduler | None = None
        self.cron_held = False
        if cfg.cron:
            self.cron = CronScheduler(connection, logging_level=cfg.log_level.upper(), name=name)
            # A .py file by its absolute path (RQ imports a relative one as a module, and -P
            # keeps the working directory off sys.path); a module through the job paths.
            path = os.path.abspath(cfg.cron) if cfg.cron.endswith(".py") else cfg.cron
            self.cron.load_config_from_file(path)

    def to_dict(self) -> dict:
        # herder_host: which herder host holds a lock, for `herder status` on any host.
        return {**super().to_dict(), "herder_host": self.host_id}

    def tick(self) -> None:
        """One round trip renews this scheduler's record and takes or keeps every queue's lock;
        then the jobs that are due move onto the queues it holds."""
        self.last_heartbeat = now()
        queues = sorted(rq_seam.scheduler_queue_names(self))
        with self.connection.pipeline() as pipe:
            pipe.hset(self.key, mapping=self.to_dict())
            pipe.expire(self.key, self.lock_ttl)
            for q in queues:
                self._lock_script(
                    keys=[self.get_locking_key(q)], args=[self.name, self.lock_ttl], client=pipe
                )
            if self.cron is not None:
                self._lock_script(keys=[CRON_LOCK_KEY], args=[self.name, self.lock_ttl], client=pipe)
            results = pipe.execute()
        # The script answers 1 (acquired), 2 (refreshed) or 0 (another scheduler holds it).
        held = {q for q, outcome in zip(queues, results[2:], strict=False) if outcome in (1, 2)}
        if self.cron is not None:
            self.cron_tick(results[-1] in (1, 2))
        before = rq_seam.scheduler_locks(self)
        if held != before or not self._ticked:
            if held - before:
                say(f"holds the scheduler lock of {', '.join(sorted(held - before))}")
            if before - held:
                say(f"lost the scheduler lock of {', '.join(sorted(before - held))}")
            if set(queues) - held:
                say(f"standing by for {', '.join(sorted(set(queues) - held))} (another scheduler holds it)")
            rq_seam.set_scheduler_locks(self, held)
            self._ticked = True
        if held:
            self.enqueue_scheduled_jobs()

    def cron_tick(self, held: bool) -> None:
        """The cron lock's holder enqueues the cron jobs that are due (RQ's own CronScheduler
        decides which, and records itself in RQ's cron scheduler registry); a standby waits."""
        assert self.cron is not None
        if held != self.cron_held:
            if held:
                jobs = len(self.cron.get_jobs())
                say(f"holds the cron lock: runs {jobs} cron jobs from {self.cron.config_file}")
                self.resume_cron()
                self.cron.register_birth()
            else:
                say("lost the cron lock")
                self.cron.register_death()
            self.cron_held = held
        elif not held and not self._ticked:
            say("standing by for cron (another host runs it)")
        if held:
            if self.cron.enqueue_jobs():
                self.cron.save()
            self.cron.heartbeat()

    def resume_cron(self) -> None:
        """Carry on where the last holder left off: each cron job's latest run is in RQ's own
        history of the jobs it enqueued, so a hand-over neither repeats a tick nor skips one
        (a new CronScheduler would run every interval job at once)."""
        assert self.cron is not None
        with self.connection.pipeline() as pipe:
            for job in self.cron.get_jobs():
                pipe.zrange(job.job_history_key, -1, -1, withscores=True)
            latest = pipe.execute()
        for job, last in zip(self.cron.get_jobs(), latest, strict=True):
            if last:
                job.set_enqueue_time(datetime.fromtimestamp(last[0][1], tz=UTC))

    def stop(self) -> None:
        if self.cron is not None and self.cron_held:
            self.connection.register_script(RELEASE_LOCK_SCRIPT)(keys=[CRON_LOCK_KEY], args=[self.name])
            self.cron.register_death()
            self.cron_held = False
        super().stop()


def run(sched: HerderScheduler, channel: Channel) -> None:
    """Tick every INTERVAL until asked to stop. A Redis outage is waited out (heartbeating
    meanwhile, so the master sees a live process); any other error is logged, at most once
    a minute, and the next tick tries again."""
    ready, outage, last_error = False, False, (0.0, "")
    while not channel.stop_reason:
        started = time.monotonic()
        try:
            sched.tick()
            if outage:
                say("Redis answers again")
            outage = False
            if not ready:
                channel.ready()
                ready = True
        except AuthenticationError:
            raise  # a configuration error, not an outage: exit, and the master says so
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            if not outage:
                say(f"waiting for Redis ({exc})")
            outage = True
        except Exception as exc:
            if started - last_error[0] >= 60 or repr(exc) != last_error[1]:
                say(f"tick failed, trying again each second:\n{traceback.format_exc()}")
                last_error = (started, repr(exc))
        while not channel.stop_reason and time.monotonic() - started < INTERVAL:
            channel.idle()  # from this loop only: a tick stuck in Redis goes silent
            time.sleep(0.05)


def main() -> int:
    cfg = Config.handed_over()
    channel = Channel(heartbeat_interval=cfg.heartbeat_interval, orphan_log=cfg.orphan_log)
    channel.start()
    name = os.environ.get(ENV_SCHEDULER_NAME)
    if not cfg.redis_url or not name:
        say(f"needs a Redis URL and {ENV_SCHEDULER_NAME} (the master sets both)")
        return 1
    # A socket timeout keeps a hung Redis from freezing the loop: ticks fail, heartbeats go on.
    timeout = max(0.5, cfg.heartbeat_timeout / 3)
    connection = connect(cfg.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout)
    for path in reversed(cfg.paths):  # the cron config imports the user's job functions
        sys.path.insert(0, os.path.abspath(path))
    sched = HerderScheduler(cfg, connection, name)
    what = [f"queues {', '.join(cfg.queues)}"] if cfg.scheduler else []
    what += [f"cron from {cfg.cron}"] if cfg.cron else []
    say(f"{name} started for {' and '.join(what)} (locks live {sched.lock_ttl} s)")
    try:
        run(sched, channel)
    finally:
        try:
            sched.stop()  # RQ's: release the locks still ours, delete this scheduler's record
        except Exception as exc:  # Redis away: the master releases them once it reaps us
            say(f"could not release the scheduler locks ({exc.__class__.__name__})")
    channel.stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
