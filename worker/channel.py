"""The worker's end of the worker <-> master channel (herder.common.worker_protocol).

At start the channel keeps a private duplicate of fd 1 for protocol lines and points
fd 1 at stderr, so a job's print, a C extension or a child process writes to the log
and can never corrupt the channel.

A sentinel thread watches the master: `stop` or EOF on stdin, or a changed parent pid,
asks the worker to stop after its current job. While a job runs, the sentinel also
sends `beat` lines so the master can tell a long job from a frozen (SIGSTOPped or
swapped-out) process. Idle heartbeats are *not* sent from this thread: they come from
the worker's main loop, so a stuck main loop goes silent and gets noticed. A busy worker's
main loop reports its progress too (`progress()`, and whether the job's own code runs): a
beat says how long the loop has been stuck outside the job (a Redis call that never returns),
and the master kills a worker stuck past --progress-timeout.

A worker that cannot reach Redis says what it waits for (`wait`, `waiting()`): in place of its
`idle` heartbeats, and from the sentinel too, so the master hears it while the main loop is
blocked in an attempt (a name resolution or a connect, inside a C call). A ready worker between
jobs whose loop has made no progress for two slices is in a Redis call that has not answered
(`stall`): the sentinel says that too. It speaks only while the main loop has moved within
`wait_bound` seconds: a loop stuck for good goes silent, and the master's kill names what it
was waiting for.
"""

from __future__ import annotations

import math
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

from herder.common import worker_protocol as wp
from herder.common.doorbell import RING_AFTER, Ringer
from herder.common.lines import LineSplitter


class Progress:
    """A loop's progress outside its job's own code: a beat says how long it has been stuck."""

    _progress_at = 0.0  # monotonic: the loop's last step
    in_job = False  # the job's own code runs: its time is the job's, not the loop's

    def progress(self) -> None:
        """The loop moved on: a Redis call answered (or failed), a dequeue slice ended."""
        self._progress_at = time.monotonic()

    def stuck_for(self) -> float:
        """Seconds the loop has made no progress outside the job's own code."""
        return 0.0 if self.in_job else time.monotonic() - self._progress_at

    # The CPU a job takes, `busy` to `done` (protocol version 10): the process's, where one job
    # runs at a time (a job's own threads count too); a thread's own, in a threaded worker. And
    # how long its thread waited for a CPU meanwhile (a busy host's time, not the job's I/O).
    cpu_clock: Callable[[], float] = staticmethod(time.process_time)
    _cpu_at: tuple[float, float | None] | None = None

    def cpu_taken(self, start: bool) -> tuple[float | None, float | None]:
        """At `busy` (start): mark the clocks; at `done`: the CPU seconds since the mark, and the
        seconds the thread waited for a CPU (None where the kernel does not say)."""
        now = (self.cpu_clock(), _runqueue_wait())
        then, self._cpu_at = self._cpu_at, now if start else None
        if start or then is None:
            return None, None
        waited = None if now[1] is None or then[1] is None else max(0.0, now[1] - then[1])
        return max(0.0, now[0] - then[0]), waited


def _runqueue_wait() -> float | None:
    """Seconds this thread has waited on a run queue, by the kernel's count (Linux's schedstat,
    about 4 us a read); None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class JobsLimit:
    """The jobs a worker process may still take: its own limit (ENV_JOBS_LIMIT, drawn by the
    master with its jitter) and the master's `retire` (past --max-memory). As RQ's --max-jobs,
    the limit counts jobs taken, and the worker takes none past it. The threads of a threaded
    worker share one: each reserves its next job before it dequeues (two threads blocked in a
    dequeue may both be handed a job), so the process never takes more than its limit."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.taken = 0
        self.retired = False  # `retire` from the master: no more jobs, whatever the count
        self._reserved = 0  # dequeues under way that may each take a job
        self._lock = threading.Lock()

    def reserve(self) -> bool:
        """Room for one more job: True (settle() must follow), or False: take none."""
        with self._lock:
            if self.retired or (self.limit is not None and self.taken + self._reserved >= self.limit):
                return False
            self._reserved += 1
            return True

    def settle(self, took: bool) -> None:
        """The reserved dequeue is over: it took a job, or none."""
        with self._lock:
            self._reserved -= 1
            self.taken += took

    def retire(self) -> None:
        self.retired = True

    @property
    def reached(self) -> bool:
        """It takes no more jobs: at its limit, or told to retire."""
        return self.retired or (self.limit is not None and self.taken >= self.limit)


class Channel(Progress):
    def __init__(
        self,
        heartbeat_interval: float = 1.0,
        orphan_log: str | None = None,
        jobs_limit: int | None = None,
        wait_bound: float = 30.0,
    ) -> None:
        self.heartbeat_interval = heartbeat_interval
        self.limit = JobsLimit(jobs_limit)  # the process's, its threads' too
        self.wait_bound = wait_bound  # --progress-timeout: how long the sentinel speaks for a stuck wait
        self.orphan_log = orphan_log
        self._fd = os.dup(1)  # private protocol fd; os.dup makes it non-inheritable
        os.dup2(2, 1)  # fd 1 -> stderr, for stray prints and child processes
        self._lock = threading.Lock()
        self._job_id: str | None = None
        # A `done` whose job's next `busy` follows at once (hold=True): both go in one write,
        # one wake-up of the master instead of two. Any line sent, or send_held(), takes it along.
        self._held = b""
        # The master's doorbell (herder.common.doorbell): rung beside news after a quiet spell,
        # so a settled master reading its quiet fleet's pipes every few seconds reads it at once.
        self._bell = Ringer.from_env()
        self._said_at = -math.inf  # monotonic: the last line other than a plain `idle`
        # The master; a worker the fork server made may still be its middle process's child.
        parents = [int(p) for p in os.environ.get(wp.ENV_PARENT_PIDS, "").split(",") if p]
        self._parent = parents[0] if parents else os.getppid()
        self._parents = {self._parent, *parents}
        self._stop_reason: str | None = None
        self._orphaned = False
        self._last_idle = 0.0
        self._last_paused: str | None = None
        # What the worker waits for (`waiting()`): (what, since, set at, said), monotonic times.
        self._wait: tuple[str, float, float, bool] | None = None
        self._last_wait = 0.0  # monotonic: the last `wait` line
        self._wait_ended = False  # the next `idle` says a wait ended: news
        # A ready worker between jobs: what its loop waits for when it has made no progress for
        # stall_after seconds (its Redis call has not answered); set by the RQ worker's attach.
        self.stall: str | None = None
        self.stall_after = max(2 * heartbeat_interval, math.ceil(heartbeat_interval) + 1.0)
        self._said_ready = False
        self.paused = False  # `herder pause`: take no new job until `resume`
        self.requests = threading.Event()  # set on each request from the master (stop, pause, resume, end)
        self.endings: deque[str] = deque()  # jobs herder gave up on, to end as RQ would (`end`)
        # Called each beat while a job runs (the worker's lease), on a thread of its own: a Redis
        # call that hangs there must never hold up the beat itself.
        self.on_beat: Callable[[], None] | None = None
        self._wakers: list[Callable[[], None]] = []  # each RQ worker's wake_dequeue (on_request)
        self._beat_due = threading.Event()
        self._beat_hook = threading.Thread(target=self._run_beat_hook, name="herder-beat-hook", daemon=True)
        self._progress_at = time.monotonic()  # the main loop's last step (monotonic)
        self.in_job = False  # the job's own code runs: its time is the job's, not the loop's
        self._sentinel = threading.Thread(target=self._watch_master, name="herder-sentinel", daemon=True)
        self._ready_threads = 0  # a threaded worker's threads that said ready (ThreadChannel)
        self.index = 0  # the thread its busy, beat and done lines are about (ThreadChannel)
        self.threads: list[ThreadChannel] = []  # a threaded worker's: beaten for by the sentinel

    # ---- lines to the master -------------------------------------------------

    def _send(self, data: bytes, news: bool = False, alive: bool = False) -> None:
        """One write of `data` (and a held line before it). `news`: the master should read it
        now (it rings the doorbell if nothing but `alive` lines went for RING_AFTER); `alive`: an
        `idle` that says what the last one did, which the master may read seconds later; neither:
        a `beat` or a repeated `wait`, which keep the master reading promptly (pipes.py)."""
        with self._lock:
            held, self._held = self._held, b""
            if self._orphaned:
                return
            try:
                if held or data:  # < PIPE_BUF together, so one atomic write
                    os.write(self._fd, held + data if held else data)
            except (BrokenPipeError, OSError):
                self._master_gone("protocol pipe closed")
                return
            if alive and not held:
                return
            now = time.monotonic()
            if (news or held) and now - self._said_at >= RING_AFTER:
                self._bell.ring()
            self._said_at = now

    def start(self) -> None:
        """Start watching the master (stdin, parent pid) and beating while busy."""
        self._sentinel.start()

    def ready(self) -> None:
        self.progress()
        self._said_ready = True
        self._send(wp.ready_line(os.getpid(), time.time()), news=True)

    def idle(self, paused: str | None = None) -> None:
        """The main loop's heartbeat; at most twice per interval, however often it is called,
        and at once when the reason it takes no jobs (`paused`) changes. While the worker waits
        (`waiting()`) the heartbeat is its `wait` line."""
        now = self._progress_at = time.monotonic()
        if self._wait is not None:
            self._say_wait(now)
            return
        changed = paused != self._last_paused or self._wait_ended
        if now - self._last_idle >= self.heartbeat_interval / 2 or changed:
            self._last_idle, self._last_paused, self._wait_ended = now, paused, False
            self._send(wp.idle_line(time.time(), paused), news=changed, alive=not changed)

    def waiting(self, what: str, since: float, say: bool = True) -> None:
        """The main loop waits for `what` ("Redis at host:6379: connection refused") since
        `since` (monotonic). `say`: tell the master now if it is news; else (an attempt under
        way, "name resolution ... not answered yet") the sentinel says it if it lasts a beat."""
        now = self._progress_at = time.monotonic()
        with self._lock:
            before = self._wait
            same = before is not None and before[0] == what
            self._wait = (what, since, before[2] if same else now, same and before[3])
        if say and not same:
            self._say_wait(now, force=True)

    def waited(self) -> None:
        """It waits no more (Redis answered): its next line, `idle` or `ready`, says so."""
        with self._lock:
            self._wait_ended = self._wait_ended or self._wait is not None
            self._wait = None

    def _say_wait(self, now: float, force: bool = False) -> None:
        """A `wait` line, at most twice per interval unless `force`d (news)."""
        with self._lock:
            wait = self._wait
            if wait is None or not force and now - self._last_wait < self.heartbeat_interval / 2:
                return
            self._wait = (wait[0], wait[1], wait[2], True)
            self._last_wait = now
        self._send(wp.wait_line(time.time(), now - wait[1], wait[0]), news=force)

    def _speak_for_wait(self) -> None:
        """The sentinel's `wait`, while the main loop is in an attempt that has not answered (a
        name resolution, a connect): only what has lasted half a beat, and only while the loop
        has moved within wait_bound (a loop stuck for good goes silent and is killed)."""
        now, wait, moved = time.monotonic(), self._wait, self._progress_at
        if now - moved > self.wait_bound:
            return
        if wait is None and self.stall and self._said_ready and now - moved > self.stall_after:
            if not any(t._job_id for t in self.threads or [self]) and self._stop_reason is None:
                # Between jobs, a call that has not answered for two slices: Redis does not answer.
                self._send(wp.wait_line(time.time(), now - moved, self.stall), news=True)
            return
        if wait is not None and (wait[3] or now - wait[2] >= self.heartbeat_interval / 2):
            self._say_wait(now)

    def busy(
        self, job_id: str, timeout: float | None, queue: str | None = None, func: str | None = None
    ) -> None:
        self.cpu_taken(start=True)
        self.job_line(self, job_id, wp.busy_line(job_id, time.time(), timeout, queue, func))

    def done(self, job_id: str, ok: bool | None, hold: bool = False) -> None:
        """ok: the job's outcome; None: an ending (`end`) is over. `hold`: the line goes with the
        next one (a `busy` that follows at once), or at send_held()."""
        cpu, waited = self.cpu_taken(start=False)
        self.job_line(self, None, wp.done_line(job_id, time.time(), ok, cpu, waited), hold)

    def job_line(
        self, owner: Channel | ThreadChannel, job_id: str | None, line: bytes, hold: bool = False
    ) -> None:
        """A `busy` (the job `owner` now runs) or a `done` (job_id None: it runs none), for the
        process itself or one thread of it (the line then names the thread)."""
        line = wp.for_thread(line, owner.index)
        with self._lock:
            owner._job_id = job_id
            if hold:
                self._held += line
        owner.progress()
        if not hold:
            self._send(line, news=True)

    def send_held(self) -> None:
        """A held `done` out now (its `busy` did not follow)."""
        if self._held:
            self._send(b"", news=True)

    def stopped(self) -> None:
        self._send(wp.stop_line(time.time()), news=True)

    # ---- requests from the master ---------------------------------------------

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
            self.requests.set()
            print(f"herder worker: stopping after the current job ({reason})", file=sys.stderr, flush=True)

    def on_request(self, wake: Callable[[], None]) -> None:
        """Call `wake` on each request from the master (stop, pause, resume, retire, end), on a thread
        of its own: it may wait on Redis, and this thread must go on beating."""
        self._wakers.append(wake)

    def _on_request(self, request: tuple[str, str | None] | None) -> None:
        if request is None:
            return
        match request:
            case ("stop", _):
                self.request_stop("stop from the master")
            case ("pause" | "resume" as verb, _):
                self.paused = verb == "pause"
            case ("retire", _):
                if not self.limit.retired:
                    self.limit.retire()
                    print("herder worker: taking no more jobs (retire from the master)", file=sys.stderr)
            case ("end", job_id) if job_id:
                self.endings.append(job_id)
        self.requests.set()
        for wake in self._wakers:
            threading.Thread(target=wake, name="herder-wake", daemon=True).start()

    def _master_gone(self, reason: str) -> None:
        """The master is dead: stop after this job, and move our output off its pipes.

        Without this a job that prints would get EPIPE and fail for no fault of its own.
        """
        self.request_stop(reason)
        if self._orphaned:
            return
        self._orphaned = True
        try:
            target = os.open(self.orphan_log or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            target = os.open(os.devnull, os.O_WRONLY)
        os.dup2(target, 1)
        os.dup2(target, 2)
        os.close(target)

    def _watch_master(self) -> None:
        stdin_open = True
        splitter = LineSplitter()
        while True:
            if stdin_open:
                readable, _, _ = select.select([0], [], [], self.heartbeat_interval)
                if readable:
                    chunk = os.read(0, 4096)
                    if not chunk:
                        stdin_open = False
                        if os.getppid() not in self._parents:
                            self._master_gone("stdin closed and the parent changed: the master is gone")
                        else:
                            self.request_stop("stdin closed")
                    for line, _ in splitter.feed(chunk):
                        self._on_request(wp.master_request(line))
                    continue
            else:
                time.sleep(self.heartbeat_interval)
            if os.getppid() not in self._parents:
                self._master_gone(f"parent changed from {self._parent} to {os.getppid()}")
            self._speak_for_wait()
            busy = False
            for thread in self.threads or [self]:
                with self._lock:
                    job_id = thread._job_id
                if job_id is not None:
                    busy = True
                    stuck = thread.stuck_for()
                    line = wp.beat_line(
                        job_id, time.time(), stuck if stuck >= self.heartbeat_interval else 0.0
                    )
                    self._send(wp.for_thread(line, thread.index))
            if busy and self.on_beat:
                if not self._beat_hook.is_alive():
                    self._beat_hook.start()
                self._beat_due.set()  # coalesced: a renewal still waiting on Redis takes this one

    def beat_threads(self) -> None:
        """A threaded worker's beat: every thread's lease (each renews at most every third of it)."""
        for thread in self.threads:
            if thread.on_beat is not None:
                thread.on_beat()

    def _run_beat_hook(self) -> None:
        while True:
            self._beat_due.wait()
            self._beat_due.clear()
            if self.on_beat is not None:
                try:
                    self.on_beat()
                except Exception:  # a lease not renewed this beat is renewed by the next
                    pass


class ThreadChannel(Progress):
    """One thread's view of a threaded worker's channel (worker/threads.py): its busy, beat and
    done lines name the thread (protocol version 8), its job and progress are its own. The
    process's `ready` goes out once every thread is ready, its `stop` once every thread is done
    (the runner sends it); idle heartbeats, the master's requests (stop, pause, end) and the
    watch on the master are the process's, shared."""

    def __init__(self, process: Channel, index: int, threads: int) -> None:
        self.process, self.index, self._threads = process, index, threads
        self._job_id: str | None = None
        self._progress_at = time.monotonic()
        self.in_job = False
        self.cpu_clock = time.thread_time  # its jobs' CPU: this thread's, not its neighbours'

        self.on_beat: Callable[[], None] | None = None  # this thread's lease (see Channel.on_beat)
        process.threads.append(self)
        process.on_beat = process.beat_threads

    # The process's, shared by every thread.
    heartbeat_interval = property(lambda self: self.process.heartbeat_interval)
    stop_reason = property(lambda self: self.process.stop_reason)
    paused = property(lambda self: self.process.paused)
    requests = property(lambda self: self.process.requests)
    limit = property(lambda self: self.process.limit)
    endings = property(lambda self: self.process.endings)

    def request_stop(self, reason: str) -> None:
        self.process.request_stop(reason)

    def on_request(self, wake: Callable[[], None]) -> None:
        self.process.on_request(wake)  # a request reaches every thread's dequeue

    def idle(self, paused: str | None = None) -> None:
        self.progress()
        self.process.idle(paused)

    def waiting(self, what: str, since: float, say: bool = True) -> None:
        self.progress()
        self.process.waiting(what, since, say)

    def waited(self) -> None:
        self.process.waited()

    def ready(self) -> None:
        """Ready once every thread is: one `ready` for the process."""
        self.progress()
        with self.process._lock:
            self.process._ready_threads += 1
            last = self.process._ready_threads == self._threads
        if last:
            self.process.ready()

    def busy(
        self, job_id: str, timeout: float | None, queue: str | None = None, func: str | None = None
    ) -> None:
        self.cpu_taken(start=True)
        self.process.job_line(self, job_id, wp.busy_line(job_id, time.time(), timeout, queue, func))

    def done(self, job_id: str, ok: bool | None, hold: bool = False) -> None:
        cpu, waited = self.cpu_taken(start=False)
        self.process.job_line(self, None, wp.done_line(job_id, time.time(), ok, cpu, waited), hold)

    def send_held(self) -> None:
        self.process.send_held()

    def stopped(self) -> None:
        """A thread's own end says nothing: the process says `stop` once all are done."""
