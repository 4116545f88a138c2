"""The crash-to-replacement scenario: with the pool idle, SIGKILL one worker; time until a new
child of the pool's master process exists (/proc/PID/task/*/children, polled), and until
that pid is registered in RQ's worker registry (the set `rq.Worker.all()` reads, polled).
Same method for every contender; for herder, its own log lines give the same two moments as a
cross-check.

The variant under load runs the same kills while one busy loop per core keeps every core busy.
After the kills without load, herder's pool also stops one idle worker (`herder scale N-1`),
timed from its log.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass, field

import psutil

from bench_base import BenchError, median, say, wait_for
from bench_contenders import Contender, Pool, RegistryWatch, Scenario
from bench_cpu import CpuMeter
from bench_herderlog import read_log, spawn_ready_times, stop_times
from bench_load import CpuHogs
from bench_procs import child_pids


@dataclass
class CrashTest(Scenario):
    load: bool = False  # the variant with every core kept busy
    # When the bench first saw each worker pid, on the monotonic clock: a worker's age.
    # (psutil's create_time is not fit for that: it adds a whole-second boot time.)
    first_seen: dict[int, float] = field(default_factory=dict)
    child_polls: list[float] = field(default_factory=list)  # seconds per poll, of the current crash run
    registry_polls: list[float] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return self.args.load_kills if self.load else self.args.kills

    def run(self) -> dict[str, dict]:
        results = {}
        under = " under full CPU load" if self.load else ""
        for c in self.launcher.contenders:
            say(f"crash to replacement{under}: {c.label}, {self.kills} kills")
            try:
                results[c.key] = self.run_one(c)
            except BenchError as exc:
                self.findings.problems.append(f"crash test{under}, {c.label}: {exc}")
                say(f"  FAILED: {exc}")
        return results

    def run_one(self, c: Contender) -> dict:
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        pool = self.launcher.launch(c, f"crash{'-load' if self.load else ''}-{c.key}")
        samples: list[dict] = []
        hogs = CpuHogs()
        one_stop: list[float] = []
        try:
            master = wait_for("the pool's master process", pool.master, timeout=30)
            self.first_seen = {}
            self.note_ages(pool.wait_ready(self.redis, timeout=60))
            if self.load:
                with hogs:
                    samples = self.kill_loop(pool, master)
            else:
                samples = self.kill_loop(pool, master)
                if c.is_herder and pool.size >= 2:
                    one_stop = self.stop_one_herder_worker(pool)
        except psutil.NoSuchProcess as exc:
            raise BenchError(f"the pool's master process is gone ({exc}); see {pool.log_path}") from exc
        finally:
            hogs.stop()  # idempotent; the `with` has done it unless the start failed half-way
            stop = self.launcher.stop(pool)
        other_load = meter.stop()
        if not self.load:  # under load, the hogs are ours, and other processes hardly get a core
            self.noise.check(other_load, meter.steal, f"crash test, {c.label}")
        result = {
            "other_load": other_load,
            "steal": meter.steal,
            "busy": hogs.busy,
            "hogs": hogs.count if self.load else 0,
            "spawn": [s["spawn"] for s in samples],
            "ready": [s["ready"] for s in samples],
            "child_poll_ms": median(self.child_polls) * 1000,
            "registry_poll_ms": median(self.registry_polls) * 1000,
            "stop": stop,
            "one_stop": one_stop,
        }
        if c.is_herder:
            result.update(self.herder_log_cross_check(pool, samples))
        if c.kind == "supervisord":
            self.check_supervisord_log(pool)
        return result

    def note_ages(self, workers: dict[int, psutil.Process]) -> None:
        now = time.monotonic()
        for pid in workers:
            self.first_seen.setdefault(pid, now)

    def pick_victim(self, pool: Pool, min_age: float) -> psutil.Process:
        """The oldest worker with no children of its own (rq's scheduler process lives under
        one of its workers), and old enough that herder's crash-loop backoff (for workers
        dying within --min-uptime of their spawn) and supervisord's (startsecs) do not apply."""

        def eligible() -> psutil.Process | None:
            workers = pool.workers(self.redis)
            self.note_ages(workers)
            now = time.monotonic()
            found = []
            for p in workers.values():
                with contextlib.suppress(psutil.Error):
                    born = self.first_seen[p.pid]
                    if not p.children() and now - born >= min_age:
                        found.append((born, p.pid, p))
            return min(found)[2] if found else None

        return wait_for("a worker to kill", eligible, timeout=60, interval=0.05)

    def kill_loop(self, pool: Pool, master: psutil.Process) -> list[dict]:
        samples: list[dict] = []
        poll = self.args.poll_interval
        child_polls, registry_polls = self.child_polls, self.registry_polls = [], []
        min_age = self.launcher.min_age(pool.contender)
        registry = RegistryWatch(self.redis)
        for k in range(1, self.kills + 1):
            time.sleep(self.args.settle)
            victim = self.pick_victim(pool, min_age)
            before = child_pids(master.pid) | {victim.pid}
            kill_wall = time.time()
            t0 = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            new_pid, t_spawn = None, math.nan
            while time.perf_counter() - t0 < 30:
                a = time.perf_counter()
                fresh = child_pids(master.pid) - before
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
                registered = registry.pids()
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
                f"  kill {k}/{self.kills}: pid {victim.pid} -> {new_pid}: "
                f"spawned {t_spawn * 1000:.1f} ms, registered {t_ready * 1000:.1f} ms"
            )
            self.note_ages(pool.wait_ready(self.redis, timeout=60, interval=0.05))
        # Before the stop, let the last replacement finish starting: a worker that rq's pool
        # forked installs its own signal handlers only after it registers, and a SIGINT in
        # between runs the pool's inherited handler instead, so that worker never stops.
        time.sleep(self.args.settle)
        return samples

    def herder_log_cross_check(self, pool: Pool, samples: list[dict]) -> dict:
        """The same two moments from herder's own log: its `spawned` and `ready` lines for each
        new pid (asctime: millisecond resolution, truncated; local time)."""
        spawned, ready = spawn_ready_times(read_log(pool.log_path))
        log_spawn, log_ready = [], []
        for s in samples:
            if s["new"] in spawned and s["new"] in ready:
                log_spawn.append(spawned[s["new"]] - s["kill_wall"])
                log_ready.append(ready[s["new"]] - s["kill_wall"])
            else:
                self.findings.problems.append(
                    f"{pool.contender.label}: no spawned/ready line in its log for replacement pid {s['new']}"
                )
        return {"log_spawn": log_spawn, "log_ready": log_ready}

    def stop_one_herder_worker(self, pool: Pool) -> list[float]:
        """`herder scale N-1`: herder stops one idle worker. The seconds from the master's
        `idle -> stopping` line for it to its `stopped` line, from the log."""
        label = pool.contender.label
        before = set(stop_times(read_log(pool.log_path)))
        done = self.launcher.herder_cli(pool, "scale", str(pool.size - 1))
        if done.returncode != 0:
            self.findings.problems.append(
                f"{label}: `herder scale {pool.size - 1}` exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-300:]}"
            )
            return []

        def stopped() -> list[float] | None:
            new = {pid: s for pid, s in stop_times(read_log(pool.log_path)).items() if pid not in before}
            return list(new.values()) or None

        try:
            seconds = wait_for(
                "herder's `stopped` line after `herder scale`", stopped, timeout=30, interval=0.05
            )
        except BenchError as exc:
            self.findings.problems.append(f"{label}: {exc}; see {pool.log_path}")
            return []
        say(
            f"  herder scale {pool.size - 1}: one idle worker stopped in {seconds[0] * 1000:.0f} ms (its log)"
        )
        return seconds

    def check_supervisord_log(self, pool: Pool) -> None:
        """A kill of a process still STARTING (younger than startsecs) would have been a failed
        start: BACKOFF, a delayed restart. The bench avoids it; this checks that it did."""
        text = pool.log_path.read_text(errors="replace")
        if "entered BACKOFF" in text or "entered FATAL" in text:
            self.findings.problems.append(
                f"{pool.contender.label}: a killed worker counted as a failed start (BACKOFF/FATAL in "
                f"{pool.log_path}): its restart was delayed by supervisord's backoff"
            )
