"""The crash-to-replacement scenario: with the pool idle, SIGKILL one worker; time until a new
child of the pool's master process exists (psutil, polled), and until that pid is registered
in RQ's worker registry (`rq.Worker.all()`, polled). Same method for every contender; for
herder, its own log lines give the same two moments as a cross-check.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from rq import Worker

from bench_base import BenchError, median, say, wait_for
from bench_contenders import CRASH_CONTENDERS, Contender, Scenario
from bench_cpu import CpuMeter

# herder's log lines, e.g. "2026-11-22 02:27:08,264 herder[3798] INFO slot 0 pid 3814: spawned -> starting"
LOG_TS = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) herder\[\d+\] \w+ slot \d+ pid (\d+): "
SPAWNED_RE = re.compile(LOG_TS + r"spawned -> ")
READY_RE = re.compile(LOG_TS + r"starting -> idle \(ready\)")


@dataclass
class CrashTest(Scenario):
    # When the bench first saw each worker pid, on the monotonic clock: a worker's age.
    # (psutil's create_time is not fit for that: it adds a whole-second boot time.)
    first_seen: dict[int, float] = field(default_factory=dict)
    child_polls: list[float] = field(default_factory=list)  # seconds per poll, of the current crash run
    registry_polls: list[float] = field(default_factory=list)

    def run(self) -> dict[str, dict]:
        results = {}
        for c in CRASH_CONTENDERS:
            say(f"crash to replacement: {c.label}, {self.args.kills} kills")
            try:
                results[c.key] = self.run_one(c)
            except BenchError as exc:
                self.findings.problems.append(f"crash test, {c.label}: {exc}")
                say(f"  FAILED: {exc}")
        return results

    def run_one(self, c: Contender) -> dict:
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        pool = self.launcher.launch(c, f"crash-{c.key}")
        samples: list[dict] = []
        try:
            master = wait_for("the pool's master process", pool.master, timeout=30)
            samples = self.kill_loop(master)
        except psutil.NoSuchProcess as exc:
            raise BenchError(f"the pool's master process is gone ({exc}); see {pool.log_path}") from exc
        finally:
            stop = self.launcher.stop(pool)
        other_load = meter.stop()
        self.noise.check(other_load, meter.steal, f"crash test, {c.label}")
        result = {
            "other_load": other_load,
            "steal": meter.steal,
            "spawn": [s["spawn"] for s in samples],
            "ready": [s["ready"] for s in samples],
            "child_poll_ms": median(self.child_polls) * 1000,
            "registry_poll_ms": median(self.registry_polls) * 1000,
            "stop": stop,
        }
        if c.kind == "herder":
            result.update(herder_log_times(pool.log_path, samples, self.findings.problems))
        return result

    def live_workers(self, master: psutil.Process) -> dict[int, psutil.Process]:
        found = {}
        now = time.monotonic()
        for p in master.children():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found[p.pid] = p
                    self.first_seen.setdefault(p.pid, now)
        return found

    def registered_pids(self) -> set[int]:
        return {w.pid for w in Worker.all(connection=self.redis) if w.pid}

    def wait_full(self, master: psutil.Process) -> dict[int, psutil.Process]:
        """Until the pool has its N workers, each a live child of the master and registered in RQ."""

        def full() -> dict[int, psutil.Process] | None:
            kids = self.live_workers(master)
            if len(kids) == self.args.workers and set(kids) <= self.registered_pids():
                return kids
            return None

        return wait_for(f"{self.args.workers} registered workers", full, timeout=60, interval=0.05)

    def pick_victim(self, master: psutil.Process) -> psutil.Process:
        """The oldest worker with no children of its own (rq's scheduler process lives under
        one of its workers), and old enough that herder's crash-loop backoff (for workers
        dying within --min-uptime of their spawn) does not apply."""

        def eligible() -> psutil.Process | None:
            now = time.monotonic()
            found = []
            for p in self.live_workers(master).values():
                with contextlib.suppress(psutil.Error):
                    born = self.first_seen[p.pid]
                    if not p.children() and now - born >= self.args.min_age:
                        found.append((born, p.pid, p))
            return min(found)[2] if found else None

        return wait_for("a worker to kill", eligible, timeout=30, interval=0.05)

    def kill_loop(self, master: psutil.Process) -> list[dict]:
        samples: list[dict] = []
        poll = self.args.poll_interval
        child_polls, registry_polls = self.child_polls, self.registry_polls = [], []
        self.first_seen = {}
        self.wait_full(master)
        for k in range(1, self.args.kills + 1):
            time.sleep(self.args.settle)
            victim = self.pick_victim(master)
            before = {p.pid for p in master.children()} | {victim.pid}
            kill_wall = time.time()
            t0 = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            new_pid, t_spawn = None, math.nan
            while time.perf_counter() - t0 < 30:
                a = time.perf_counter()
                fresh = {p.pid for p in master.children()} - before
                child_polls.append(time.perf_counter() - a)
                if fresh:
                    t_spawn = time.perf_counter() - t0
                    new_pid = min(fresh)
                    self.first_seen[new_pid] = time.monotonic()
                    break
                time.sleep(poll)
            if new_pid is None:
                raise BenchError(f"kill {k}: no replacement process within 30 s")
            t_ready = math.nan
            while time.perf_counter() - t0 < 60:
                a = time.perf_counter()
                registered = self.registered_pids()
                registry_polls.append(time.perf_counter() - a)
                if new_pid in registered:
                    t_ready = time.perf_counter() - t0
                    break
                time.sleep(poll)
            if math.isnan(t_ready):
                raise BenchError(f"kill {k}: replacement pid {new_pid} not in RQ's registry within 60 s")
            samples.append(
                {
                    "victim": victim.pid,
                    "new": new_pid,
                    "spawn": t_spawn,
                    "ready": t_ready,
                    "kill_wall": kill_wall,
                }
            )
            say(
                f"  kill {k}/{self.args.kills}: pid {victim.pid} -> {new_pid}: "
                f"spawned {t_spawn * 1000:.1f} ms, registered {t_ready * 1000:.1f} ms"
            )
            self.wait_full(master)
        # Before the stop, let the last replacement finish starting: a worker that rq's pool
        # forked installs its own signal handlers only after it registers, and a SIGINT in
        # between runs the pool's inherited handler instead, so that worker never stops.
        time.sleep(self.args.settle)
        return samples


def herder_log_times(log_path: Path, samples: list[dict], problems: list[str]) -> dict:
    """Cross-check from herder's own log: its `spawned` and `ready` lines for each new pid.
    asctime has millisecond resolution (truncated), in local time."""

    def stamp(text: str) -> float:
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()

    spawned, ready = {}, {}
    for line in log_path.read_text(errors="replace").splitlines():
        if m := SPAWNED_RE.match(line):
            spawned[int(m[2])] = stamp(m[1])
        elif m := READY_RE.match(line):
            ready[int(m[2])] = stamp(m[1])
    log_spawn, log_ready = [], []
    for s in samples:
        if s["new"] in spawned and s["new"] in ready:
            log_spawn.append(spawned[s["new"]] - s["kill_wall"])
            log_ready.append(ready[s["new"]] - s["kill_wall"])
        else:
            problems.append(f"herder's log has no spawned/ready line for replacement pid {s['new']}")
    return {"log_spawn": log_spawn, "log_ready": log_ready}
