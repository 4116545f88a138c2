"""Full CPU load for the crash test's variant: one busy-looping Python per core
(`python -c "while True: pass"`), all in one process group of their own, killed together.
They are the bench's children, so the final clean-up finds them as well."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from bench_procs import child_env

HOG = "while True: pass"


class CpuHogs:
    """`with CpuHogs(n):` n busy loops for the length of the block; `busy` is the share of
    the machine's CPU that was in use while they ran (1.0: every core busy)."""

    def __init__(self, count: int | None = None) -> None:
        self.count = count or os.cpu_count() or 1
        self.popens: list[subprocess.Popen[bytes]] = []
        self.pgid = 0
        self.busy = float("nan")
        self._cpu0: psutil._common.scputimes | None = None

    def start(self) -> None:
        for i in range(self.count):
            self.popens.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=child_env(),
                    close_fds=True,
                    # The first starts a process group of its own; the others join it.
                    process_group=self.pgid,
                )
            )
            if i == 0:
                self.pgid = self.popens[0].pid
        time.sleep(0.3)  # until they spin
        self._cpu0 = psutil.cpu_times()

    def stop(self) -> None:
        if self._cpu0 is not None:
            a, b = self._cpu0, psutil.cpu_times()
            total = sum(b) - sum(a)
            idle = (b.idle - a.idle) + (getattr(b, "iowait", 0.0) - getattr(a, "iowait", 0.0))
            self.busy = 1 - idle / total if total > 0 else float("nan")
            self._cpu0 = None
        if self.pgid:
            with contextlib.suppress(OSError):
                os.killpg(self.pgid, signal.SIGKILL)
            self.pgid = 0  # once they are reaped, the number may name someone else's group
        for p in self.popens:
            with contextlib.suppress(OSError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self.popens = []

    def __enter__(self) -> CpuHogs:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
