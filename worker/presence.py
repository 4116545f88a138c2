"""What the master and RQ see of a herder worker, whatever it is doing: its state and heartbeats
(RQ's, with herder's lease in the same round trip), its `idle` and `wait` lines, a pause, its
registration, its signals and RQ's remote commands. Part of HerderMixin (worker/rq_worker.py).

RQ's remote commands work as RQ documents them: `send_shutdown_command` is a graceful stop
(the job finishes, the worker says `stop` and exits 0, and the master replaces it as it would
after its own `stop`), and `send_stop_job_command` stops the job in this process (JobStopped,
raised in the job's thread, the way RQ's own timeout is) so RQ marks it stopped, never
requeued, and the worker goes on to the next job.

Paused (`rq suspend` on any host, or `herder pause` on this one) it takes no new job: it is
checked before every dequeue slice, so a worker waiting on the queue notices `rq suspend`
within one slice (a heartbeat interval) and `pause` at once (the request wakes its dequeue),
and while paused it keeps saying `idle <ts> suspended|paused`, so the master neither kills it
nor counts it as a fault, and a `stop` ends it at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.command import parse_payload
from rq.exceptions import StopRequested
from rq.suspension import is_suspended
from rq.worker import WorkerStatus

from herder.common import rq_seam
from herder.common.rq_names import client_name, lease_key
from herder.worker import reach
from herder.worker.base import HerderBase, JobStopped, RedisAway, Woken
from herder.worker.channel import Channel

# What an idle worker's connection is blocked in, as CLIENT LIST names it.
BLOCKING_DEQUEUES = frozenset({"blmove", "blpop", "brpoplpush", "bzpopmin"})
STOP_JOB_SIGNAL = signal.SIGUSR1  # the pubsub thread asks the main thread to stop the job


def raise_in_thread(ident: int, exc: type[BaseException]) -> None:
    """Raise `exc` in another thread of this process, at its next Python instruction (as
    RQ's TimerDeathPenalty does; a blocking C call finishes first)."""
    if ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc)) > 1:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


class Presence(HerderBase):
    """The protocol and RQ's registration side of herder's worker (see the module doc)."""

    def attach(self, channel: Channel, lease_seconds: float) -> None:
        self.channel = channel
        self.lease_ttl = max(1, round(lease_seconds))
        self.lease = lease_key(self.name)
        self.lease_renewed = float("-inf")  # monotonic
        channel.on_beat = self.renew_lease  # while a job runs, from the channel's thread
        channel.on_request(self.wake_dequeue)  # the process's channel, a threaded worker's too
        process = getattr(channel, "process", channel)  # a threaded worker's: its process's
        if isinstance(process, Channel):  # what a loop stuck in a Redis call between jobs waits for
            process.stall = f"{reach.Target.of(self.connection).where}: no answer yet"

    def wake_dequeue(self) -> None:
        """A request came from the master: end this worker's blocking dequeue now, as its
        timeout would (CLIENT UNBLOCK: Redis returns nothing, or the job it already moved),
        so the loop sees the request at once, not at the end of the slice. Best effort: where
        CLIENT LIST or UNBLOCK is denied, the slice's end does it. Called on a thread of its own.
        Marked woken even when not in the dequeue yet: a request that comes between the loop's
        look at the requests and its blocking call would otherwise wait out a whole slice; RQ's
        loop's first heartbeat() leaves it instead (and a worker busy then looks once more)."""
        self._woken = True  # RQ's loop would block again for the rest of its idle time: heartbeat()
        if not self._dequeuing:
            return
        names = {self.name, client_name()}  # RQ names one of its connections; herder names every one
        for _ in range(3):  # the loop may be between two calls: a moment later it blocks
            try:
                blocked = [
                    int(c["id"])
                    for c in self.connection.client_list()
                    if c.get("name") in names and c.get("cmd") in BLOCKING_DEQUEUES
                ]
                for client_id in blocked:
                    self.connection.client_unblock(client_id)
            except RedisError:
                return
            if blocked or not (self._dequeuing and self._woken):
                return
            time.sleep(0.02)

    def renew_lease(self, pipeline=None) -> None:  # noqa: ANN001 - a redis Pipeline or None
        """The lease says this process is alive; an error here only delays it a beat.

        RQ calls heartbeat() twice per job; a SET each time was a round trip per call (about
        a tenth of a no-op job's cost). A third of the lease's life between renewals is enough.
        """
        now = time.monotonic()
        if self.lease_quiet or now - self.lease_renewed < self.lease_ttl / 3:
            return
        try:
            (pipeline or self.connection).set(self.lease, "1", ex=self.lease_ttl)
            self.lease_renewed = now
        except Exception:
            if pipeline is not None:
                raise

    def procline(self, message: str) -> None:
        """RQ retitles its process at each step of each job when setproctitle is installed (a
        herder dependency): that would rename herder's workers (ps -o comm, psutil's name())
        and cost a syscall per step. herder's worker keeps its title; `herder status` says
        what each worker is doing."""

    def _install_signal_handlers(self) -> None:
        # Graceful stop is `stop` on stdin (or EOF). A signal from herder means "now":
        # RQ's warm shutdown would let an unresponsive job run on, and its cold shutdown
        # raises SystemExit inside the job, which RQ then records as a failed job. With
        # the default action the process just ends and the master requeues the job.
        if self.thread_ident is not None:
            return  # a threaded worker's thread: the process's main thread set them (threads.py)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(STOP_JOB_SIGNAL, self._stop_job_now)

    def _stop_job_now(self, signum: int, frame: object) -> None:
        job_id = rq_seam.stopped_job_id(self)
        if job_id is not None and job_id == self._performing:  # never in RQ's own bookkeeping
            raise JobStopped(f"job {job_id} stopped by RQ's send_stop_job_command")

    def handle_payload(self, message) -> None:  # noqa: ANN001 - a redis pubsub message
        """RQ's remote commands, from its pubsub thread. `shutdown` would SIGINT this process
        (ending the job mid-way): here it is the graceful stop herder's `stop` is."""
        if parse_payload(message).get("command") == "shutdown":
            self.log.info(
                "Worker %s: RQ's shutdown command: finishing the current job, then exiting", self.name
            )
            self.channel.request_stop("RQ's shutdown command")
            self.wake_dequeue()  # an idle worker stops now, as RQ's does, not at its slice's end
            return
        super().handle_payload(message)

    def kill_horse(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """RQ's send_stop_job_command calls this once it has marked the job to stop. With no
        horse the job runs in this process, so its main thread is told to stop it."""
        if self.horse_pid:
            super().kill_horse(sig)  # a forking worker class: RQ's own way
        elif self.thread_ident is not None:  # one thread of a threaded worker: raised in that thread
            job_id = rq_seam.stopped_job_id(self)
            if job_id is not None and job_id == self._performing:
                raise_in_thread(self.thread_ident, JobStopped)
        else:
            os.kill(os.getpid(), STOP_JOB_SIGNAL)

    def unsubscribe(self) -> None:
        """RQ's, in an order that does not race. RQ sends UNSUBSCRIBE, then tells its pubsub
        thread to stop: when the reply wakes the thread first, it blocks for another 60 s
        and the worker's exit waits out RQ's join(timeout=1). Told first, it ends on the reply."""
        if self.pubsub_thread:
            self.pubsub_thread.stop()
            self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()

    def bootstrap(self, *args, **kwargs) -> None:  # type: ignore[override]
        """RQ's, tried again while Redis is away (a worker born as Redis went down waits for it,
        heartbeating, rather than exit and back its slot off)."""
        while True:
            try:
                super().bootstrap(*args, **kwargs)
                break
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self.channel.stop_reason:
                    raise StopRequested() from exc
                self.redis_away(exc)
        self.redis_back()
        if self.nice_when_ready:  # listed by RQ: from now on below the master
            os.nice(self.nice_when_ready)
            self.nice_when_ready = 0
        self.channel.ready()  # registered, and subscribed to RQ's commands

    _away_since: float | None = None  # monotonic: when Redis stopped answering this worker

    def redis_away(self, exc: Exception) -> None:
        """A Redis call outside a job failed for want of Redis: said once an outage, then a
        heartbeat and a pause before the caller tries again."""
        self._idle_said = False  # a Redis that comes back may have lost the worker's hash
        if self._away_since is None:
            self._away_since = time.monotonic()
            print(
                f"herder worker: waiting for Redis ({exc.__class__.__name__}: {exc})",
                file=sys.stderr,
                flush=True,
            )
        # What it waits for, to the master (`wait`, in place of its `idle` until Redis answers).
        target = reach.Target.of(self.connection)
        self.channel.waiting(f"{target.where}: {reach.describe(exc, target.password)}", self._away_since)
        self.channel.idle()
        self.channel.requests.wait(min(1.0, self.channel.heartbeat_interval))

    def redis_back(self) -> None:
        if self._away_since is not None:
            self.channel.waited()
            away, self._away_since = time.monotonic() - self._away_since, None
            print(f"herder worker: Redis answers again after {away:.1f} s", file=sys.stderr, flush=True)

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:  # type: ignore[override]
        # RQ calls this on its main loop before every dequeue attempt, including each retry
        # while Redis is down: the `idle` line goes first, so an outage does not make a
        # healthy worker look hung. Calls inside a job's bookkeeping come with a pipeline.
        fast = self.fast
        if pipeline is None and fast is not None and fast.finish.pending is not None:
            # Rides with the held finish (fast path); `idle` after `done`.
            if timeout is None and not self.rq_beat_due():
                return
            pipeline = fast.finish.pending.after
        if pipeline is None and timeout is None and self._dequeuing and self._woken:
            self._woken = False
            raise Woken()  # no job taken: back to herder's loop, which reads the request
        self.channel.progress()  # the main loop (RQ's retries while Redis is away too)
        if pipeline is None and self.get_state() != "busy":
            self.channel.idle()
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            self.renew_lease(pipeline)  # in the same round trip as RQ's own
            return
        self.beat_redis(timeout)

    def beat_redis(self, timeout: int | None = None) -> None:
        """RQ's heartbeat and herder's lease, in one round trip (RQ's own heartbeat is three).
        Without a timeout at most twice a heartbeat interval: RQ calls heartbeat() before and
        after every dequeue, twice a job and twice an idle slice, and RQ's worker key lives
        minutes (worker_ttl)."""
        if timeout is None and not self.rq_beat_due():
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)
                self.renew_lease(pipe)
                pipe.execute()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Missed: the next one goes out (RQ's key lives minutes; the lease a few seconds).
            self._rq_beat_at = self.lease_renewed = float("-inf")
            if self._dequeuing:  # RQ.s dequeue loop, no job taken: wait for Redis in herder's wait
                raise RedisAway(exc) from exc

    def rq_beat_due(self) -> bool:
        """Whether RQ's heartbeat is due (at most twice a heartbeat interval); taken if so."""
        now = time.monotonic()
        if now - self._rq_beat_at < self.channel.heartbeat_interval / 2:
            return False
        self._rq_beat_at = now
        return True

    def set_state(self, state: str, pipeline=None) -> None:  # noqa: ANN001 - a redis Pipeline or None
        # RQ's dequeue says `idle` as each of its waits begins, and herder's waits are slices of a
        # heartbeat interval: once said, an idle worker does not say it again every slice (a
        # round trip a second; at 256 idle workers, a good part of a core).
        fast = self.fast
        if pipeline is None and fast is not None and fast.finish.pending is not None:
            pipeline = fast.finish.pending.after  # while a finish is held, written with it, in order
        if pipeline is None and self._dequeuing and state == WorkerStatus.IDLE:
            if self._idle_said and self._state == WorkerStatus.IDLE:
                return
            super().set_state(state, pipeline)
            self._idle_said = True
            return
        if self._idle_said:  # not set unless it was: RQ's start leaves no field of its own
            self._idle_said = False
        super().set_state(state, pipeline)

    def pause_reason(self) -> str | None:
        """ "paused" (herder pause), "suspended" (rq suspend) or None. A Redis that does not
        answer is no pause: the dequeue rides out the outage as it always does."""
        if self.channel.paused:
            return "paused"
        try:
            # Without the heartbeat RQ's check adds: herder's heartbeat() keeps its own pace
            # (an idle slice renewed it twice a second, a round trip each).
            return "suspended" if is_suspended(self.connection) else None
        except RedisError:
            return None

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's check, made herder's: also `herder pause`; heartbeats while it waits; `stop`
        ends the wait at once (RQ's sleeps a second at a time and says nothing)."""
        fast = self.fast
        if fast is not None and fast.finish.pending is not None:
            if not self.channel.paused:
                return  # the take checks RQ's suspension in the same round trip
            fast.flush()
        why = self.pause_reason()
        if why is None:
            return
        if burst:
            raise StopRequested()
        before = self.get_state()
        self.set_state(WorkerStatus.SUSPENDED)
        self.log.info("Worker %s: %s, taking no jobs until it is resumed", self.name, why)
        while why is not None and not self._stop_requested:
            if self.channel.stop_reason:
                raise StopRequested()
            self.channel.idle(paused=why)
            self.beat_redis()  # RQ's own check heartbeats a suspended worker; so does herder's
            self.channel.requests.clear()
            self.channel.requests.wait(0.5)  # a stop or resume from the master ends it at once
            why = self.pause_reason()
        self.set_state(before)
        self.log.info("Worker %s: resumed", self.name)
