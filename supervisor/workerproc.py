"""One worker subprocess and the readers of its two pipes: the real ProcessHandle
(herder.supervisor.fleet) that the process launcher hands the master.

Readers only record what they saw; the master's loop reads a snapshot and decides. One
thread feeds every worker's readers (herder.supervisor.pipes), so the master's cost per line
does not grow with the fleet. Whatever a worker writes, the master's memory stays bounded:
lines are length-capped, stderr is rate-limited, a stdout flood is slowed by back-pressure
(its pipe is left unread for the rest of the second, the worker blocks on it).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from herder.common.worker_protocol import (
    ENV_POOL,
    MAX_LINE_BYTES,
    PAUSE,
    RESUME,
    STOP,
    LineSplitter,
    ProtocolError,
    end_request,
    parse_line,
)
from herder.supervisor import logs, pipes

log = logging.getLogger("herder")

# A busy worker sends ~3 lines a job; 20k lines/s is ~6x the fastest no-op job rate seen.
STDOUT_LINES_PER_SECOND = 20_000
STDERR_LINES_PER_SECOND = 1000  # RQ logs ~4 lines a job; fast no-op jobs reach ~250 jobs/s
# The pids of processes a WorkerProcess watches and has not reaped: whoever reaps strays
# (the master, a subreaper with the fork server) must leave these to their owner.
WATCHED: set[int] = set()


@dataclass
class Observations:
    """What the stdout reader saw. Written by the reader under `lock`, read by the loop."""

    last_seen: float  # monotonic time of the last valid line
    ready: bool = False
    job_id: str | None = None
    job_started: float = 0.0  # monotonic, on receipt of `busy`
    job_timeout: float | None = None
    jobs_ok: int = 0
    jobs_failed: int = 0
    last_done_wall: float | None = None  # the worker's completion timestamp
    busy_seconds: float = 0.0  # summed busy->done durations, for the per-worker job rate
    said_stop: bool = False
    stdout_eof: bool = False
    eof_at: float = 0.0  # monotonic
    malformed: int = 0
    oversized: int = 0
    throttled: int = 0  # times the reader paused a flooding worker
    stderr_dropped: int = 0
    last_error: str = ""
    paused: str | None = None  # why it takes no jobs, from its last `idle`: suspended or paused
    endings: int = 0  # given-up jobs this worker ended (`end`), which count as no job
    job_queue: str | None = None  # the running job's queue and function (`busy`, version 5)
    job_func: str | None = None
    job_started_wall: float = 0.0  # the worker's own time of `busy`
    # Since when (monotonic) its main loop has made no progress outside the job's own code, as
    # its last `beat` said (version 6); None while it progresses.
    stuck_since: float | None = None


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One job done, for the per-function job metrics (herder.supervisor.jobstats)."""

    queue: str
    func: str
    ok: bool
    seconds: float  # busy -> done, on the worker's own clock


# Finished jobs a worker's reader keeps until the loop takes them (a flood drops the oldest).
FINISHED_KEPT = 10_000


class Child(Protocol):
    """What WorkerProcess needs of the process it watches: a subprocess.Popen (started
    directly) or a ForkedChild (forked by the fork server, herder.supervisor.forkserver)."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None

    def wait(self) -> int: ...


class ForkedChild:
    """A worker the fork server forked: the master's child (it is the subreaper the fork
    server's double fork hands it to), with pipes the master made; Popen's shape."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self.pid, self.returncode = pid, None
        self.stdin: IO[bytes] | None = open(stdin_fd, "wb", buffering=0)  # noqa: SIM115 - closed in reap
        self.stdout: IO[bytes] | None = open(stdout_fd, "rb", buffering=0)  # noqa: SIM115 - its reader's
        self.stderr: IO[bytes] | None = open(stderr_fd, "rb", buffering=0)  # noqa: SIM115 - its reader's

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)  # -N for signal N, as Popen
            except ChildProcessError:  # never handed to us (the master is no subreaper)
                self.returncode = 255
        return self.returncode

    def adopting(self) -> bool:
        """Not our child yet, but alive: its middle parent is still exiting."""
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


@dataclass
class WorkerProcess:
    popen: Child
    label: str  # "slot N pid P", the prefix of its relayed stderr
    obs: Observations
    fields: dict[str, Any] = field(default_factory=dict)  # what its relayed JSON lines carry
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: deque[FinishedJob] = field(default_factory=lambda: deque(maxlen=FINISHED_KEPT))
    stdout_done: threading.Event = field(default_factory=threading.Event)  # its reader saw EOF

    @property
    def pid(self) -> int:
        return self.popen.pid

    @classmethod
    def spawn(
        cls,
        argv: list[str],
        env: dict[str, str],
        slot: int,
        wake: Callable[[], None],
        kind: str = "",
        pass_fds: tuple[int, ...] = (),
    ) -> WorkerProcess:
        """Start it; `kind` names a process that is not the fleet's in its log lines (else "slot N")."""
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
            pass_fds=pass_fds,
            # Its own process group: herder signals the worker and any children its job
            # started together, and a Ctrl-C at the terminal reaches only the master,
            # which drains the workers instead.
            process_group=0,
        )
        return cls.watch(popen, slot, wake, kind, pool="" if kind else env.get(ENV_POOL, ""))

    @classmethod
    def watch(
        cls, child: Child, slot: int, wake: Callable[[], None], kind: str = "", pool: str = ""
    ) -> WorkerProcess:
        """Watch a started process's pipes (the readers start here); `pool`: a fleet worker's."""
        popen = child
        assert popen.stdin and popen.stdout and popen.stderr
        os.set_blocking(popen.stdin.fileno(), False)  # the master never blocks on a worker
        fields: dict[str, Any] = {"process": kind.replace(" ", "") or "worker", "pid": popen.pid}
        if not kind:
            fields.update(pool=pool, slot=slot)
        proc = cls(
            popen=popen,
            label=f"{kind or f'slot {slot}'} pid {popen.pid}",
            obs=Observations(last_seen=time.monotonic()),
            fields=fields,
        )
        WATCHED.add(popen.pid)
        hub = pipes.hub()
        if logs.flush_held not in hub.after_pass:  # relayed lines: one write a pass
            hub.after_pass.append(logs.flush_held)
        hub.add(popen.stdout.fileno(), StdoutReader(proc, wake))
        hub.add(popen.stderr.fileno(), StderrReader(proc))
        return proc

    # ---- readers -------------------------------------------------------------------

    def _record(self, raw: bytes) -> bool:
        """Record one stdout line; True if the master should look now."""
        now = time.monotonic()
        try:
            msg = parse_line(raw)
        except ProtocolError as exc:
            with self.lock:
                self.obs.malformed += 1
                self.obs.last_error = str(exc)
            return False
        with self.lock:
            o = self.obs
            o.last_seen = now
            match msg.verb:
                case "ready":
                    o.ready = True
                    return True
                case "beat":
                    o.stuck_since = now - msg.stuck if msg.stuck > 0 else None
                case "idle":
                    o.paused = msg.paused
                    o.stuck_since = None
                case "busy":
                    o.stuck_since = None
                    o.job_id, o.job_started, o.job_timeout = msg.job_id, now, msg.timeout
                    o.job_queue, o.job_func, o.job_started_wall = msg.queue, msg.func, msg.ts
                    o.paused = None
                case "done" if msg.ok is None:  # an ending (`end`) is over: no job of its own
                    o.endings += 1
                    if o.job_id == msg.job_id:
                        o.job_id = None
                case "done":
                    o.stuck_since = None
                    if o.job_id == msg.job_id:
                        o.busy_seconds += now - o.job_started
                    if msg.ok:
                        o.jobs_ok += 1
                    else:
                        o.jobs_failed += 1
                    if o.job_id == msg.job_id and o.job_queue is not None:
                        seconds = max(0.0, msg.ts - o.job_started_wall)
                        self.finished.append(FinishedJob(o.job_queue, o.job_func or "?", msg.ok, seconds))
                    o.last_done_wall = msg.ts
                    if o.job_id == msg.job_id:
                        o.job_id = None
                case "stop":
                    o.said_stop = True
                    return True
        return False

    def _json_fields(self) -> dict[str, Any]:
        """Its relayed lines' fields, with the job it runs as the master reads them (best
        effort: a line written right at a job's start or end may miss it)."""
        with self.lock:
            job_id = self.obs.job_id
        return dict(self.fields, job_id=job_id) if job_id else self.fields

    # ---- the ProcessHandle (called by the master loop only) --------------------------------

    def snapshot(self) -> Observations:
        with self.lock:
            return Observations(**vars(self.obs))

    def unread(self) -> int:
        """Bytes waiting in its stdout pipe that the hub has not read yet (a starved master's
        hub falls behind: a worker whose lines wait there is not silent)."""
        try:
            assert self.popen.stdout
            return struct.unpack("i", fcntl.ioctl(self.popen.stdout.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        except (OSError, ValueError, AssertionError):
            return 0  # closed, or not a pipe

    def take_finished(self) -> list[FinishedJob]:
        """The jobs finished since the last call (the loop folds them into the job metrics)."""
        with self.lock:
            done = list(self.finished)
            self.finished.clear()
        return done

    def send_stop(self) -> None:
        self._tell(STOP)  # a worker that does not read stdin is killed at the stop timeout

    def send_pause(self, paused: bool) -> None:
        self._tell(PAUSE if paused else RESUME)  # a --worker-command program may ignore it

    def send_end(self, job_id: str) -> None:
        self._tell(end_request(job_id))

    def _tell(self, line: bytes) -> None:
        assert self.popen.stdin
        try:
            os.write(self.popen.stdin.fileno(), line)
        except (BlockingIOError, BrokenPipeError, OSError):
            pass

    def signal_group(self, sig: int) -> None:
        """Signal the worker's process group, which holds the children its jobs started."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def has_exited(self) -> bool:
        """True once the worker is a zombie, without reaping it.

        Not reaping keeps its pid and process group reserved, so the master can still
        SIGKILL stragglers in the group before the group id can be reused.
        """
        if self.popen.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return not (isinstance(self.popen, ForkedChild) and self.popen.adopting())
        return info is not None

    def reap(self) -> int:
        """Kill what is left of the process group, reap the worker, close pipes."""
        self.signal_group(signal.SIGKILL)
        code = self.popen.wait()
        WATCHED.discard(self.pid)
        # The stdout reader may still hold the worker's last lines (its final `done`): the hub
        # reads them now, not after its coalescing pause.
        if not self.stdout_done.is_set():
            try:  # even if a flood paused it (the reader closes it at EOF: then no fd is needed)
                fd = self.popen.stdout.fileno() if self.popen.stdout else None
            except ValueError:
                fd = None
            pipes.hub().hurry(fd)
            self.stdout_done.wait(timeout=1.0)
        try:
            if self.popen.stdin:
                self.popen.stdin.close()
        except OSError:
            pass
        return code


class StdoutReader:
    """The protocol channel: each line recorded in the worker's Observations (pipes.PipeReader)."""

    order = 0  # before stderr in a pass of the hub

    def __init__(self, proc: WorkerProcess, wake: Callable[[], None]) -> None:
        self.proc, self.wake = proc, wake
        self.splitter = LineSplitter(MAX_LINE_BYTES)
        self.window_start, self.lines = time.monotonic(), 0

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        proc, important = self.proc, False
        for raw, truncated in self.splitter.feed(chunk):
            self.lines += 1
            if truncated:
                with proc.lock:
                    proc.obs.oversized += 1
                    proc.obs.last_error = f"line longer than {MAX_LINE_BYTES} bytes"
                continue
            important |= proc._record(raw)
        if now - self.window_start >= 1.0:
            self.window_start, self.lines = now, 0
        elif self.lines > STDOUT_LINES_PER_SECOND:  # a flood: unread for the rest of the second
            with proc.lock:
                proc.obs.throttled += 1
            return important, self.window_start + 1.0
        return important, None

    def eof(self) -> None:
        proc = self.proc
        with proc.lock:
            proc.obs.stdout_eof = True
            proc.obs.eof_at = time.monotonic()
        assert proc.popen.stdout
        proc.popen.stdout.close()  # the reader owns its pipe: no fd is closed under a read
        proc.stdout_done.set()


class StderrReader:
    """Whatever the worker (and its jobs) print: relayed into herder's log, rate-limited."""

    order = 1

    def __init__(self, proc: WorkerProcess) -> None:
        self.proc = proc
        self.wake: Callable[[], None] = _nothing  # stderr never needs the loop's attention
        self.splitter = LineSplitter(MAX_LINE_BYTES)
        self.window_start, self.logged = time.monotonic(), 0

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        proc = self.proc
        if now - self.window_start >= 1.0:
            self.window_start, self.logged = now, 0
        lines = []
        for raw, truncated in self.splitter.feed(chunk):
            if self.logged >= STDERR_LINES_PER_SECOND:  # the master reports the count
                with proc.lock:
                    proc.obs.stderr_dropped += 1
                continue
            self.logged += 1
            text = raw.decode("utf-8", "replace").rstrip()
            lines.append(text + " [line truncated]" if truncated else text)
        logs.relay(proc.label, lines, proc._json_fields() if lines and logs.json_lines else None, hold=True)
        return False, None

    def eof(self) -> None:
        proc = self.proc
        tail = self.splitter.flush()
        if tail:
            lines = [tail.decode("utf-8", "replace").rstrip()]
            logs.relay(proc.label, lines, proc._json_fields() if logs.json_lines else None)
        assert proc.popen.stderr
        proc.popen.stderr.close()


def _nothing() -> None:
    pass
