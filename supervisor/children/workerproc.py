"""One worker subprocess: the real ProcessHandle (herder.supervisor.children.fleet) that the process
launcher hands the master. It starts (or adopts) the process, hands its pipes to their readers
(dispatchers.py, on the one pipes thread), tells it `stop`, `pause`, `resume` and `end` on its
stdin, signals its process group and reaps it. The readers only record what they saw
(observations.py); the master's loop reads a snapshot and decides.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import psutil

from herder.common import handover, processes
from herder.common.worker_protocol import ENV_POOL, PAUSE, RESUME, RETIRE, STOP, end_request
from herder.supervisor.children import logs, pipes
from herder.supervisor.children.changes import CHANGED
from herder.supervisor.children.dispatchers import StderrReader, StdoutReader
from herder.supervisor.children.observations import FINISHED_KEPT, FinishedJob, Observations

log = logging.getLogger("herder")

# The pids of processes a WorkerProcess watches and has not reaped: whoever reaps strays
# (the master, a subreaper with the fork server) must leave these to their owner.
WATCHED: set[int] = set()


class Child(Protocol):
    """What WorkerProcess needs of the process it watches: a subprocess.Popen (started
    directly) or a ForkedChild (forked by the fork server, herder.supervisor.children.forkserver)."""

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
        return processes.exists(self.pid)


@dataclass
class WorkerProcess:
    popen: Child
    label: str  # "slot N pid P", the prefix of its relayed stderr
    obs: Observations
    fields: dict[str, Any] = field(default_factory=dict)  # what its relayed JSON lines carry
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: deque[FinishedJob] = field(default_factory=lambda: deque(maxlen=FINISHED_KEPT))
    stdout_done: threading.Event = field(default_factory=threading.Event)  # its reader saw EOF
    # The loop's last snapshot, until a reader changes obs: a pass reads each worker several
    # times (murder, retire, scale, the sweep's list, the snapshot), and an idle worker's
    # Observations change about once a second, not once a pass.
    _snap: Observations | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def changing(self) -> _Changing:
        """The readers' one way to change obs: under the lock, and the next snapshot is new."""
        return _Changing(self)

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
        """Start it; `kind` names a process that is not the fleet's in its log lines (else "slot N").
        Its config, if its spec holds one, is handed over on a descriptor (herder.common.handover)."""
        with handover.handed(env, pass_fds) as (child_env, fds):
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env,
                close_fds=True,
                pass_fds=fds,
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
        CHANGED.add(proc.pid)  # born: the loop looks at it next pass
        return proc

    @property
    def stdout(self) -> IO[bytes]:
        assert self.popen.stdout
        return self.popen.stdout

    @property
    def stderr(self) -> IO[bytes]:
        assert self.popen.stderr
        return self.popen.stderr

    def json_fields(self) -> dict[str, Any]:
        """Its relayed lines' fields, with the job it runs as the master reads them (best
        effort: a line written right at a job's start or end may miss it)."""
        with self.lock:
            job_id = self.obs.job_id
        return dict(self.fields, job_id=job_id) if job_id else self.fields

    # ---- the ProcessHandle (called by the master loop only) --------------------------------

    def snapshot(self) -> Observations:
        """A copy the readers do not change (every caller only reads it)."""
        snap = self._snap  # no lock for a kept one: a reader's change clears it before it writes
        if snap is not None:
            return snap
        with self.lock:
            if self._snap is None:
                self._snap = self.obs.copy()
            return self._snap

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

    def send_retire(self) -> None:
        self._tell(RETIRE)  # a --worker-command program may ignore it: it then takes jobs until `stop`

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


class _Changing:
    """`with proc.changing() as obs`: a plain class, not a generator context manager, which
    costs several times as much, and the readers take one for every line."""

    __slots__ = ("proc", "quiet")

    def __init__(self, proc: WorkerProcess) -> None:
        self.proc = proc
        self.quiet = False  # set by a reader whose line only said the worker is alive

    def __enter__(self) -> Observations:
        proc = self.proc
        proc.lock.acquire()
        proc._snap = None
        return proc.obs

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        proc.lock.release()
        if not self.quiet:
            CHANGED.add(proc.popen.pid)  # the loop looks at it next pass (changes.py)


PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int | None:
    """A process's resident set in bytes, or None if it is gone or unreadable (the one reading
    recycling and the advice take): on Linux one small read of /proc, where psutil would make a
    Process and read its stat file first."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * PAGE
        except (OSError, ValueError, IndexError):
            return None
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
