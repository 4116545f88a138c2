"""The crash-to-replacement scenario: SIGKILL one worker of a pool; time until RQ lists its
replacement (the `sadd` to the set `rq.Worker.all()` reads, as Redis's keyspace notification
says it, so nothing is polled meanwhile) and, where jobs wait, until the replacement takes its
first one (its worker hash, polled). Same method for every contender, a median of several kills;
for herder, its own log lines give its `spawned` and `ready` moments as a cross-check.

Four variants (what a user sees after each):
- idle: the pool has run nothing yet;
- busy: the pool has just drained a busy spell (--busy-jobs no-op jobs), and idles;
- noisy: every worker runs jobs that print to stdout and stderr, a backlog always waiting;
- load: idle workers while one busy loop per core keeps every core busy.
After the idle kills, herder's pool also stops one idle worker (`herder scale N-1`), timed from
its log.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from dataclasses import dataclass, field

import psutil
from rq import Queue

from bench_base import BenchError, say, wait_for
from bench_contenders import (
    JOB_FUNC,
    NOISY_FUNC,
    QUEUE,
    RQ_DEFAULT,
    Contender,
    ListingWatch,
    Pool,
    Scenario,
    first_job_taken,
)
from bench_cpu import CpuMeter
from bench_herderlog import read_log, spawn_ready_times, stop_times
from bench_load import CpuHogs

MODES = {
    "idle": "",
    "busy": " after a busy spell",
    "noisy": " under noisy full load",
    "load": " under full CPU load",
}
NOISY_BACKLOG = 3000  # noisy jobs kept waiting: every worker busy through the kills


@dataclass
class CrashTest(Scenario):
    mode: str = "idle"
    # When the bench first saw each worker pid, on the monotonic clock: a worker's age.
    # (psutil's create_time is not fit for that: it adds a whole-second boot time.)
    first_seen: dict[int, float] = field(default_factory=dict)

    @property
    def kills(self) -> int:
        return self.args.load_kills if self.mode == "load" else self.args.kills

    def run(self) -> dict[str, dict]:
        results = {}
        for c in self.launcher.contenders:
            if self.mode == "noisy" and c == RQ_DEFAULT:
                continue  # its busy workers each have a work horse: no worker is a lone process to kill
            say(f"crash to replacement{MODES[self.mode]}: {c.label}, {self.kills} kills")
            res = self.attempt(f"crash test{MODES[self.mode]}, {c.label}", lambda c=c: self.run_one(c))
            if res is not None:
                results[c.key] = res
        return results

    def run_one(self, c: Contender) -> dict:
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        pool = self.launcher.launch(c, f"crash-{self.mode}-{c.key}")
        samples: list[dict] = []
        hogs = CpuHogs()
        one_stop: list[float] = []
        try:
            master = wait_for("the pool's master process", pool.master, timeout=30)
            self.first_seen = {}
            self.note_ages(pool.wait_ready(self.redis, timeout=60))
            if self.mode == "busy":
                self.busy_spell(pool)
            if self.mode == "load":
                with hogs:
                    samples = self.kill_loop(pool, master)
            else:
                samples = self.kill_loop(pool, master)
                if self.mode == "idle" and c.is_herder and pool.size >= 2:
                    one_stop = self.stop_one_herder_worker(pool)
        except psutil.NoSuchProcess as exc:
            raise BenchError(f"the pool's master process is gone ({exc}); see {pool.log_path}") from exc
        finally:
            hogs.stop()  # idempotent; the `with` has done it unless the start failed half-way
            self.redis.delete(f"rq:queue:{QUEUE}")  # the noisy backlog: the stop waits for no job
            stop = self.launcher.stop(pool)
        other_load = meter.stop()
        if self.mode in ("idle", "busy"):  # otherwise the load is ours
            self.noise.check(other_load, meter.steal, f"crash test{MODES[self.mode]}, {c.label}")
        result = {
            "other_load": other_load,
            "steal": meter.steal,
            "busy": hogs.busy,
            "hogs": hogs.count if self.mode == "load" else 0,
            "listed": [s["listed"] for s in samples],
            "first_job": [s["first_job"] for s in samples],
            "stop": stop,
            "one_stop": one_stop,
        }
        if c.is_herder:
            result.update(self.herder_log_cross_check(pool, samples))
        if c.kind == "supervisord":
            self.check_supervisord_log(pool)
        return result

    def enqueue(self, func: str, n: int) -> None:
        """`n` jobs of `func`, in pipelines of 5,000."""
        q = Queue(QUEUE, connection=self.redis)
        while n > 0:
            with self.redis.pipeline() as pipe:
                q.enqueue_many([Queue.prepare_data(func, ()) for _ in range(min(n, 5000))], pipeline=pipe)
                pipe.execute()
            n -= 5000

    def busy_spell(self, pool: Pool) -> None:
        """--busy-jobs no-op jobs, run to the last; then the pool idles again."""
        self.enqueue(JOB_FUNC, self.args.busy_jobs)
        wait_for(
            "the busy spell drained",
            lambda: self.redis.llen(f"rq:queue:{QUEUE}") == 0 or None,
            timeout=300,
            interval=0.1,
        )
        time.sleep(self.args.settle)
        say(f"  busy spell: {self.args.busy_jobs} jobs run")

    def top_up_noise(self) -> None:
        """Keep a backlog of noisy jobs: every worker stays busy, printing."""
        self.enqueue(NOISY_FUNC, NOISY_BACKLOG - self.redis.llen(f"rq:queue:{QUEUE}"))

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
        min_age = self.launcher.min_age(pool.contender)
        listing = ListingWatch(self.redis)
        try:
            for k in range(1, self.kills + 1):
                if self.mode == "noisy":
                    self.top_up_noise()
                time.sleep(self.args.settle)
                victim = self.pick_victim(pool, min_age)
                before = listing.drain()
                kill_wall = time.time()
                t0 = time.perf_counter()
                os.kill(victim.pid, signal.SIGKILL)
                found = listing.wait_new(before, t0, timeout=60)
                if found is None:
                    raise BenchError(f"kill {k}: no replacement listed by RQ within 60 s")
                name, t_listed = found
                t_job = math.nan
                if self.mode == "noisy":
                    t_job = first_job_taken(self.redis, name, t0, 30, self.args.poll_interval)
                new_pid = int(self.redis.hget(name, "pid") or 0)
                self.first_seen[new_pid] = time.monotonic()
                samples.append(
                    {
                        "victim": victim.pid,
                        "new": new_pid,
                        "listed": t_listed,
                        "first_job": t_job,
                        "kill_wall": kill_wall,
                    }  # fmt: skip
                )
                job = "" if math.isnan(t_job) else f", first job taken {t_job * 1000:.1f} ms"
                listed = f"listed {t_listed * 1000:.1f} ms"
                say(f"  kill {k}/{self.kills}: pid {victim.pid} -> {new_pid}: {listed}{job}")
                self.note_ages(pool.wait_ready(self.redis, timeout=60, interval=0.05))
        finally:
            listing.close()
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
