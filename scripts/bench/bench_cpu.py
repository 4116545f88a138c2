"""CPU metering: CPU time by role inside a pool, and the noise from everything else on the machine."""

from __future__ import annotations

import contextlib
import math
import resource
import sys
import time
from collections.abc import Iterable

import psutil

from bench_base import Findings, say


class CpuMeter:
    """CPU time spent by processes that are not ours during an interval, in cores: a noise
    indicator (the bench shares the machine with whatever else runs on it).

    Ours = the bench, its reaped descendants (RUSAGE_CHILDREN: as a subreaper it reaps even
    orphans) and its live descendants (Redis). Pools are stopped and reaped before `stop()`.
    On a virtual machine, `steal` (time the hypervisor gave to other guests) is noise too.
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0, self.ours0, self.steal0 = self._busy(), self._ours(), self._steal()
        self.steal = math.nan  # cores, set by stop()

    @staticmethod
    def _steal() -> float:
        return getattr(psutil.cpu_times(), "steal", 0.0)

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest is in user
        return total - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0)

    @staticmethod
    def _ours() -> float:
        used = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            used += r.ru_utime + r.ru_stime
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    c = p.cpu_times()
                    used += c.user + c.system
        return used

    def stop(self) -> float:
        elapsed = time.monotonic() - self.t0
        foreign = (self._busy() - self.busy0) - (self._ours() - self.ours0)
        if elapsed <= 0:
            return math.nan
        self.steal = (self._steal() - self.steal0) / elapsed
        return max(0.0, foreign) / elapsed


def cpu_by_role(top_pid: int, supervisor_pids: Iterable[int]) -> tuple[float, float]:
    """CPU seconds used so far by (the supervising processes, the rest) of the process tree
    under `top_pid`. Reaped children count in their parent's children times, so rq's work
    horses are charged to the worker that forked them."""
    sup = work = 0.0
    try:
        top = psutil.Process(top_pid)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        return math.nan, math.nan
    sup_pids = set(supervisor_pids)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            used = t.user + t.system + t.children_user + t.children_system
            if p.pid in sup_pids:
                sup += used
            else:
                work += used
    return sup, work


def process_cpu(p: psutil.Process) -> float:
    """The process's CPU time (user + system, its threads, not its children), in seconds.
    On Linux from the kernel's CPU clock of that pid, to the nanosecond: psutil's cpu_times()
    counts in clock ticks (10 ms), and a 4-worker run's master uses about 50 ms, so ticks
    quantized its figure per 1,000 jobs into steps of a fifth."""
    if sys.platform.startswith("linux"):
        try:  # clockid of a pid's CPU clock: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
            return time.clock_gettime_ns(((~p.pid) << 3) | 2) / 1e9
        except OSError:
            pass  # it is gone, or the clock is not readable here: psutil says which
    t = p.cpu_times()
    return t.user + t.system


class Noise:
    """Noise control: wait for a quiet machine before a run, flag a run that was not quiet."""

    def __init__(self, quiet_wait: float, max_other_load: float, findings: Findings) -> None:
        self.quiet_wait = quiet_wait
        self.max_other_load = max_other_load
        self.findings = findings

    def wait_quiet(self) -> None:
        """Before a run: wait (up to --quiet-wait s) for other processes to calm down."""
        deadline = time.monotonic() + self.quiet_wait
        said = -math.inf
        while self.quiet_wait > 0:
            meter = CpuMeter()
            time.sleep(1.0)
            load = meter.stop()
            if load <= self.max_other_load and meter.steal <= self.max_other_load:
                return
            if time.monotonic() > deadline:
                say(f"  the machine is still busy ({load:.2f} cores of other processes): going ahead")
                return
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                say(f"  waiting for a quieter machine: other processes use {load:.2f} cores")

    def check(self, load: float, steal: float, what: str) -> None:
        for cores, who in ((steal, "the hypervisor stole"), (load, "other processes used")):
            if cores > self.max_other_load:
                self.findings.warnings.append(
                    f"{what}: {who} {cores:.2f} cores on average during the run "
                    f"(over --max-other-load {self.max_other_load:g}): its numbers are noisy"
                )
