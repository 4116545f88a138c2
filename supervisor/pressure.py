"""Memory pressure: the cgroup's working set near its limit (herder.common.cgroup) stops
scale-up, and says why in status and /healthz. A container or pod that autoscaling walks
into its memory limit gets OOM-killed whole: better to hold the count and let the backlog
wait, which the queue-length metrics and the health reason show.

Read at most every READ_EVERY seconds (a read parses /proc/self/mountinfo: ~0.4 ms).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from herder.common.cgroup import memory_pressure, oom_kills

log = logging.getLogger("herder")

READ_EVERY = 1.0
THRESHOLD = 0.9  # of the cgroup's memory limit


class MemoryWatch:
    def __init__(self, read: Callable[[], str | None] | None = None) -> None:
        self.read = read or (lambda: memory_pressure(THRESHOLD))
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


class OomWatch:
    """Did the kernel's OOM killer kill since the last look? Read when a worker died by a
    SIGKILL herder did not send: its cgroup's (or an ancestor's) OOM kill counter moved."""

    def __init__(self, read: Callable[[], tuple[int, ...] | None] = oom_kills) -> None:
        self.read = read
        self.seen = read()

    def killed(self) -> bool:
        now = self.read()
        moved = now is not None and self.seen is not None and now != self.seen
        self.seen = now if now is not None else self.seen
        return moved
