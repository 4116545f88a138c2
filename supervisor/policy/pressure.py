"""Memory pressure: the cgroup's working set near its limit (herder.common.cgroup) stops
scale-up, and says why in status and /healthz. A container or pod that autoscaling walks
into its memory limit gets OOM-killed whole: better to hold the count and let the backlog
wait, which the queue-length metrics and the health reason show.

Its usage is read at most every READ_EVERY seconds; which cgroup's limit binds only every
LIMIT_EVERY (finding it parses /proc/self/mountinfo and reads each level: ~0.5 ms, most of
an idle master's reading, and a limit changes seldom).

Also here: whether a worker that died by a SIGKILL nobody in herder sent was the OOM
killer's (the cgroup's counter, the kernel's log).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable

from herder.common.cgroup import Found, memory_max, memory_pressure, oom_kills

log = logging.getLogger("herder")

READ_EVERY = 1.0
LIMIT_EVERY = 30.0
THRESHOLD = 0.9  # of the cgroup's memory limit


class BindingLimit:
    """The cgroup memory limit that binds, found again every LIMIT_EVERY seconds; its pressure
    read each time it is asked."""

    def __init__(self, find: Callable[[], Found | None] = memory_max) -> None:
        self.find = find
        self.limit: Found | None = None
        self._found_at = float("-inf")

    def pressure(self) -> str | None:
        now = time.monotonic()
        if now - self._found_at >= LIMIT_EVERY:
            self._found_at, self.limit = now, self.find()
        return memory_pressure(THRESHOLD, limit=self.limit) if self.limit else None


class MemoryWatch:
    def __init__(self, read: Callable[[], str | None] | None = None) -> None:
        self.read = read or BindingLimit().pressure
        self.reason = ""  # why scale-up is held, or ""
        self._read_at = float("-inf")

    def check(self, now: float) -> str:
        if now - self._read_at >= READ_EVERY:
            self._read_at = now
            reason = self.read() or ""
            if reason and not self.reason:
                log.warning("memory pressure: %s; no scale-up until it eases", reason)
            elif self.reason and not reason:
                log.info("memory pressure eased: scale-up allowed again")
            self.reason = reason
        return self.reason


class KernelLog:
    """The kernel's log (/dev/kmsg), where this process may read it (root or CAP_SYSLOG, and
    in the host's pid namespace, where the pids it names are ours): the pids the OOM killer
    killed since herder started. Read without blocking, only when a worker died by a SIGKILL
    herder did not send; records lost to the ring's wrap are skipped."""

    KILLED = re.compile(rb"Killed process (\d+) ")
    INIT_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's fixed inode of the first pid namespace
    MAX_RECORDS = 10_000  # per look: a flooding log never holds up the loop for long

    def __init__(self, path: str = "/dev/kmsg", pid_namespace: Callable[[], str] | None = None) -> None:
        self.named: deque[int] = deque(maxlen=256)
        self.fd: int | None = None
        try:
            if (pid_namespace or (lambda: os.readlink("/proc/self/ns/pid")))() != self.INIT_PID_NAMESPACE:
                return  # a container's own pid namespace: the log's pids are the host's
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)  # from now on: older kills are not this herder's
        except OSError:
            self.close()

    def oom_killed(self, pid: int) -> bool:
        self._read()
        if pid not in self.named:
            return False
        self.named.remove(pid)  # told once: a later process with this pid is another
        return True

    def _read(self) -> None:
        for _ in range(self.MAX_RECORDS):
            if self.fd is None:
                return
            try:
                record = os.read(self.fd, 8192)  # one record per read from /dev/kmsg
            except BlockingIOError:
                return
            except BrokenPipeError:  # the ring wrapped past us: on with what is left
                continue
            except OSError:
                self.close()
                return
            if not record:
                return
            self.named.extend(int(m.group(1)) for m in self.KILLED.finditer(record))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class OomWatch:
    """Did the kernel's OOM killer kill this worker? Asked when a worker died by a SIGKILL
    herder did not send: yes when the kernel's log names its pid, or when the OOM kill counter
    of herder's own cgroup (its own processes', common/cgroup.py) moved since the last look."""

    def __init__(
        self, read: Callable[[], int | None] = oom_kills, kernel_log: KernelLog | None = None
    ) -> None:
        self.read = read
        self.seen = read()
        self.kernel_log = kernel_log

    def killed(self, pid: int) -> bool:
        now = self.read()
        moved = now is not None and self.seen is not None and now != self.seen
        self.seen = now if now is not None else self.seen
        named = self.kernel_log is not None and self.kernel_log.oom_killed(pid)
        return moved or named
