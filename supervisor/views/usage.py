"""Workers' RSS and CPU, read with psutil at most once a second and shared by every reader
(status, the snapshot the dashboard shows): a busy page or a status loop costs the master one
sampling a second, not one a request. CPU percent is over the time since the last sampling."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import psutil

from herder.supervisor.children.workerproc import rss

EVERY = 1.0  # seconds between two samplings


class Usage:
    def __init__(self, clock: Callable[[], float], every: float = EVERY) -> None:
        self.clock, self.every = clock, every
        self._processes: dict[int, psutil.Process] = {}  # kept: cpu_percent() measures since the last call
        self._last: dict[int, tuple[int | None, float | None]] = {}
        self._at = float("-inf")

    def of(self, pids: Iterable[int]) -> dict[int, tuple[int | None, float | None]]:
        """pid -> (RSS bytes, CPU percent), None where unreadable; fresh at most once a second."""
        wanted = set(pids)
        now = self.clock()
        if now - self._at >= self.every:
            self._at = now
            self._last = {pid: self._sample(pid) for pid in wanted}
            for gone in set(self._processes) - wanted:
                self._processes.pop(gone, None)
        else:  # a worker new since the last sampling: read it alone (its CPU from now on)
            self._last.update({pid: self._sample(pid) for pid in wanted - set(self._last)})
        return {pid: self._last[pid] for pid in wanted}

    def rss(self, pids: Iterable[int]) -> dict[int, int | None]:
        """pid -> RSS bytes now (None where unreadable), leaving the CPU sampling above alone:
        the advice's evidence reads a few workers at a time, and asking `of` for those would
        drop every other worker's kept process and its CPU measurement."""
        return {pid: rss(pid) for pid in pids}

    def _sample(self, pid: int) -> tuple[int | None, float | None]:
        try:
            proc = self._processes.get(pid) or self._processes.setdefault(pid, psutil.Process(pid))
            with proc.oneshot():
                return proc.memory_info().rss, proc.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._processes.pop(pid, None)
            return None, None


SHARED = Usage(time.monotonic)  # the master's one sampler: status and the dashboard's snapshot
