"""The scaling scenario: herder (and, unless told otherwise, rq worker-pool with SimpleWorker
and supervisord + rq worker) at several pool sizes (--scale-sizes, default 4,16,64,256).
The peers run only at sizes up to --scale-peers-max (default 64: a few hundred fresh `rq
worker` interpreters take minutes to start on a small machine); herder runs at every size,
with `--workers-limit N` above 16 (bench_contenders.py), as its default limit is
min(16 x CPUs, memory / 64 MiB).

herder's variants run --scale-runs times (default 3), in rounds: each round runs every size
once, back to back, so a ratio between two sizes compares runs of the same minutes (a shared
machine's speed drifts from one half hour to the next). A row of the table is the median run;
the targets' ratios are each round's, and the median of those. The peers run once.

Each run: enqueue the jobs on a side list (max(--scale-jobs-min, --scale-jobs-per-worker x N));
launch the pool of N on the empty queue; time until all N workers are registered; let it idle
(--idle-settle) and read memory and the supervising process's thread count; move all the jobs
into the queue at once (RENAME); time them (RQ's job timestamps, as in bench_throughput.py;
--round-timeout grows with the jobs);
the supervising process's CPU time (psutil, user + system, that process alone) between the
release and the last job done, per 1,000 jobs; its peak thread count meanwhile.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import psutil

from bench_base import BenchError, say
from bench_contenders import BY_KEY, Contender, Scenario
from bench_cpu import CpuMeter, process_cpu
from bench_memory import pool_memory
from bench_throughput import enqueue, job_times, release, wait_done

IDLE_CPU_WINDOW = 3.0  # seconds the supervising process's idle CPU is read over


class ScalingTest(Scenario):
    def contenders(self) -> list[Contender]:
        keys = [k.strip() for k in self.args.scale_contenders.split(",") if k.strip()]
        running = {c.key for c in self.launcher.contenders}
        return [BY_KEY[k] for k in keys if k in running]

    def skipped(self, c: Contender, size: int) -> bool:
        """A peer above --scale-peers-max (herder's variants run at every size)."""
        return not c.is_herder and 0 < self.args.scale_peers_max < size

    def jobs_for(self, size: int) -> int:
        return max(self.args.scale_jobs_min, self.args.scale_jobs_per_worker * size)

    def run(self) -> dict[str, dict[int, dict]]:
        contenders = self.contenders()
        runs: dict[str, dict[int, list[dict]]] = {c.key: {} for c in contenders}
        rounds = self.args.scale_runs
        for turn in range(1, rounds + 1):
            for size in self.args.scale_sizes:
                for c in contenders:
                    if turn > 1 and not c.is_herder:
                        continue  # the peers' figures are context, not targets: one run each
                    if self.skipped(c, size):
                        if turn == 1:
                            say(f"scaling: {c.label}, {size} workers: skipped (above --scale-peers-max)")
                        continue
                    res = self.run_logged(c, size, turn)
                    if res is not None:
                        res["round"] = turn
                        runs[c.key].setdefault(size, []).append(res)
        return {key: {size: median_run(rs) for size, rs in by_size.items()} for key, by_size in runs.items()}

    def run_logged(self, c: Contender, size: int, turn: int) -> dict | None:
        which = f" (round {turn} of {self.args.scale_runs})" if c.is_herder else ""
        say(f"scaling: {c.label}, {size} workers, {self.jobs_for(size)} jobs{which}")
        res = self.attempt(f"scaling, {c.label}, {size} workers", lambda: self.run_one(c, size, turn))
        if res is not None:
            say(
                f"  all registered {res['ready']:.2f} s after launch; {res['jobs_per_s']:.0f} jobs/s; "
                f"supervisor CPU {res['sup_cpu_per_1000'] * 1000:.0f} ms per 1,000 jobs, "
                f"RSS {res['memory']['sup_rss']:.1f} MB, "
                f"threads {res['threads_idle']}/{res['threads_peak']}; "
                f"worker USS {res['memory']['worker_uss']:.1f} MB; stopped in {res['stop'].seconds:.1f} s"
            )
        return res

    def run_one(self, c: Contender, size: int, turn: int = 1) -> dict:
        n = self.jobs_for(size)
        self.noise.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        ids = enqueue(self.redis, n, staged=True)
        pool = self.launcher.launch(c, f"scale-{c.key}-{size}" + (f"-{turn}" if turn > 1 else ""), size)
        try:
            pool.wait_ready(self.redis, timeout=60 + 2 * size, interval=0.02)
            ready = time.monotonic() - pool.launched_mono
            time.sleep(self.args.idle_settle)
            master = pool.master()
            if master is None:
                raise BenchError(f"no master process; see {pool.log_path}")
            # The supervising process's CPU while the pool idles (a share of one core).
            idle_cpu0, idle_at = process_cpu(master), time.monotonic()
            time.sleep(IDLE_CPU_WINDOW)
            idle_cpu = (process_cpu(master) - idle_cpu0) / (time.monotonic() - idle_at)
            memory = pool_memory(pool.popen.pid, master, pool.workers(self.redis))
            threads = [master.num_threads()]
            polls = 0

            def sample(_done: int) -> None:
                nonlocal polls
                polls += 1
                if polls % 10 == 0:
                    with contextlib.suppress(psutil.Error):
                        threads.append(master.num_threads())

            cpu0 = process_cpu(master)
            release(self.redis)
            timeout = self.args.round_timeout * max(1.0, n / self.args.jobs)
            wait_done(self.redis, pool, n, timeout, sample)
            cpu1 = process_cpu(master)
        except psutil.NoSuchProcess as exc:
            raise BenchError(f"the pool's master process is gone ({exc}); see {pool.log_path}") from exc
        finally:
            stop = self.launcher.stop(pool)
        starts, ends, by_worker = job_times(self.redis, ids, pool.log_path)
        first, last = min(starts), max(ends)
        other_load = meter.stop()
        self.noise.check(other_load, meter.steal, f"scaling, {c.label}, {size} workers")
        return {
            "jobs": n,
            "ready": ready,
            "jobs_per_s": n / (last - first) if last > first else math.nan,
            "sup_cpu_per_1000": (cpu1 - cpu0) / n * 1000,
            "sup_idle_cpu": idle_cpu,
            "threads_idle": threads[0],
            "threads_peak": max(threads),
            "memory": memory,
            "workers_used": len(by_worker),
            "stop": stop,
            "other_load": other_load,
            "steal": meter.steal,
        }


MEDIAN_FIELDS = ("ready", "jobs_per_s", "sup_cpu_per_1000", "sup_idle_cpu")


def median_run(runs: list[dict]) -> dict:
    """A size's runs as one row: the median of each timed figure, the most threads seen, and the
    run of the median CPU for the rest (memory, stop); every run kept under "runs"."""
    mid = sorted(runs, key=lambda r: r["sup_cpu_per_1000"])[len(runs) // 2]
    row = dict(mid, runs=runs)
    for name in MEDIAN_FIELDS:
        row[name] = statistics.median(r[name] for r in runs)
    row["threads_idle"] = max(r["threads_idle"] for r in runs)
    row["threads_peak"] = max(r["threads_peak"] for r in runs)
    return row
